#include "core/validation.h"

namespace tutti {
namespace {

[[noreturn]] void invalid(const Request& q, const std::string& message) {
  throwError(StatusCode::kInvalidArgument,
             std::string(opTypeName(q.op)) + " " + quotedName(q.name) + ": " + message);
}

bool isControlOp(OpType op) {
  return op == OpType::kBarrier || op == OpType::kJoin || op == OpType::kAddProcessSet ||
         op == OpType::kRemoveProcessSet;
}

constexpr size_t kMaxNameBytes = 4096;

}  // namespace

void validateRequest(const Request& q, int set_size) {
  if (isControlOp(q.op)) return;
  if (q.name.size() > kMaxNameBytes)
    invalid(q, "name is " + std::to_string(q.name.size()) + " bytes, expected at most " +
                   std::to_string(kMaxNameBytes));
  if (!isValidDataType(static_cast<int>(q.dtype)))
    invalid(q, "dtype " + std::to_string(static_cast<int>(q.dtype)) + " is not a tutti dtype");
  if (!isValidReduceOp(static_cast<int>(q.reduce_op)))
    invalid(q, "reduce op " + std::to_string(static_cast<int>(q.reduce_op)) + " is not a tutti reduce op");
  if (q.shape.size() > TUTTI_MAX_DIMS)
    invalid(q, "shape has " + std::to_string(q.shape.size()) + " dimensions, expected at most " +
                   std::to_string(TUTTI_MAX_DIMS));
  for (int64_t d : q.shape)
    if (d < 0) invalid(q, "shape " + shapeString(q.shape) + " has a negative dimension");
  int64_t bytes = 0;
  if (!tensorBytes(q.shape, q.dtype, &bytes))
    invalid(q, "shape " + shapeString(q.shape) + " of " + dataTypeName(q.dtype) +
                   " is too large (expected at most " + std::to_string(kMaxTensorBytes) +
                   " bytes, counting every non-zero dimension)");
  if ((q.op == OpType::kAllreduce || q.op == OpType::kReducescatter) && q.dtype == DataType::kBool &&
      q.reduce_op == ReduceOp::kAverage)
    invalid(q, "average of bool tensors is undefined; use sum (logical or) or min (logical and)");
  if ((q.op == OpType::kAllgather || q.op == OpType::kAlltoall || q.op == OpType::kReducescatter) &&
      q.shape.empty())
    invalid(q, "needs a tensor with at least one dimension, got a scalar");
  // A group's size comes from the submitting rank: the coordinator holds that many members.
  constexpr int32_t kMaxGroup = 1 << 24;
  if (!q.group.empty() && (q.group_size < 2 || q.group_size > kMaxGroup))
    invalid(q, "group " + quotedName(q.group) + " of " + std::to_string(q.group_size) +
                   " tensors, expected 2 to " + std::to_string(kMaxGroup));
  if (q.op == OpType::kBroadcast && (q.root < 0 || q.root >= set_size))
    invalid(q, "root " + std::to_string(q.root) + " is outside the process set (expected 0.." +
                   std::to_string(set_size - 1) + ")");
  if (q.op == OpType::kAlltoall) {
    if (static_cast<int64_t>(q.splits.size()) != set_size)
      invalid(q, "splits has " + std::to_string(q.splits.size()) + " entries but the process set has " +
                     std::to_string(set_size) + " ranks");
    for (int64_t s : q.splits)
      if (s < 0) invalid(q, "splits contain a negative count (" + std::to_string(s) + ")");
    int64_t sum = 0;
    bool over = false;
    for (int64_t s : q.splits) {
      over = !checkedAdd(sum, s, &sum) || sum > q.shape[0];
      if (over) break;
    }
    if (over || sum != q.shape[0])
      invalid(q, "splits sum to " + (over ? "more than " + std::to_string(q.shape[0]) : std::to_string(sum)) +
                     " but the first dimension is " + std::to_string(q.shape[0]));
  }
}

void validateEntry(TensorEntry& e, int set_size) {
  Request& q = e.request;
  if (isControlOp(q.op)) return;
  // Equal splits are filled in before the checks, once the shape is known to be sane.
  if (q.op == OpType::kAlltoall && q.splits.empty() && !q.shape.empty() && q.shape[0] >= 0) {
    if (q.shape[0] % set_size != 0)
      invalid(q, "first dimension " + std::to_string(q.shape[0]) + " does not split evenly over " +
                     std::to_string(set_size) + " ranks; pass splits");
    q.splits.assign(set_size, q.shape[0] / set_size);
  }
  validateRequest(q, set_size);
  const int64_t n = shapeElements(q.shape);
  const bool writes_output = q.op == OpType::kAllreduce || q.op == OpType::kBroadcast;
  if (n > 0 && e.input == nullptr && q.op != OpType::kBroadcast)
    invalid(q, "input is null for " + std::to_string(n) + " elements");
  if (n > 0 && writes_output && e.output == nullptr)
    invalid(q, "output is null for " + std::to_string(n) + " elements");
}

}  // namespace tutti
