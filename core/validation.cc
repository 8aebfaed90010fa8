#include "core/validation.h"

#include <numeric>

namespace tutti {
namespace {

[[noreturn]] void invalid(const Request& q, const std::string& message) {
  throwError(StatusCode::kInvalidArgument,
             std::string(opTypeName(q.op)) + " '" + q.name + "': " + message);
}

}  // namespace

void validateEntry(TensorEntry& e, int set_size) {
  Request& q = e.request;
  if (q.op == OpType::kBarrier || q.op == OpType::kJoin || q.op == OpType::kAddProcessSet ||
      q.op == OpType::kRemoveProcessSet)
    return;
  if (q.name.size() > 4096) invalid(q, "name longer than 4096 characters");
  if (!isValidDataType(static_cast<int>(q.dtype)))
    invalid(q, "dtype " + std::to_string(static_cast<int>(q.dtype)) + " is not a tutti dtype");
  if (!isValidReduceOp(static_cast<int>(q.reduce_op)))
    invalid(q, "reduce op " + std::to_string(static_cast<int>(q.reduce_op)) + " is not a tutti reduce op");
  int64_t n = 1;
  for (int64_t d : q.shape) {
    if (d < 0) invalid(q, "shape " + shapeString(q.shape) + " has a negative dimension");
    n *= d;
  }
  const bool writes_output = q.op == OpType::kAllreduce || q.op == OpType::kBroadcast;
  if (n > 0 && e.input == nullptr && q.op != OpType::kBroadcast)
    invalid(q, "input is null for " + std::to_string(n) + " elements");
  if (n > 0 && writes_output && e.output == nullptr)
    invalid(q, "output is null for " + std::to_string(n) + " elements");
  if ((q.op == OpType::kAllreduce || q.op == OpType::kReducescatter) && q.dtype == DataType::kBool &&
      q.reduce_op == ReduceOp::kAverage)
    invalid(q, "average of bool tensors is undefined; use sum (logical or) or min (logical and)");
  if ((q.op == OpType::kAllgather || q.op == OpType::kAlltoall || q.op == OpType::kReducescatter) &&
      q.shape.empty())
    invalid(q, "needs a tensor with at least one dimension, got a scalar");
  if (q.op == OpType::kBroadcast && (q.root < 0 || q.root >= set_size))
    invalid(q, "root " + std::to_string(q.root) + " is outside the process set (expected 0.." +
                   std::to_string(set_size - 1) + ")");
  if (q.op == OpType::kAlltoall) {
    if (q.splits.empty()) {
      if (q.shape[0] % set_size != 0)
        invalid(q, "first dimension " + std::to_string(q.shape[0]) +
                       " does not split evenly over " + std::to_string(set_size) +
                       " ranks; pass splits");
      q.splits.assign(set_size, q.shape[0] / set_size);
    }
    if (static_cast<int>(q.splits.size()) != set_size)
      invalid(q, "splits has " + std::to_string(q.splits.size()) + " entries but the process set has " +
                     std::to_string(set_size) + " ranks");
    int64_t sum = 0;
    for (int64_t s : q.splits) {
      if (s < 0) invalid(q, "splits contain a negative count");
      sum += s;
    }
    if (sum != q.shape[0])
      invalid(q, "splits sum to " + std::to_string(sum) + " but the first dimension is " +
                     std::to_string(q.shape[0]));
  }
}

}  // namespace tutti
