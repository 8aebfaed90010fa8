#include "base/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <sstream>

namespace tutti {

const char* opTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
    case OpType::kAddProcessSet: return "add_process_set";
    case OpType::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown-op";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown-reduce-op";
}

const char* deviceTypeName(DeviceType device) {
  return device == DeviceType::kCuda ? "cuda" : "cpu";
}

// dataTypeName and dataTypeSize are inline in tutti/tutti.hpp (public, header-only).

bool isValidDataType(int dtype) { return dtype >= 0 && dtype < kNumDataTypes; }
bool isValidReduceOp(int op) { return op >= TUTTI_SUM && op <= TUTTI_PRODUCT; }

Deadline deadlineAfter(double seconds) {
  // Outside +-1e9 s (or NaN) the conversion to clock ticks would overflow.
  if (std::isnan(seconds)) seconds = 0;
  seconds = std::min(std::max(seconds, -1e9), 1e9);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

double secondsLeft(Deadline deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

void throwError(StatusCode code, const std::string& message) { throw Error(code, message); }

std::string shapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shapeElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool checkedMul(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool checkedAdd(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool tensorBytes(const std::vector<int64_t>& shape, DataType dtype, int64_t* bytes) {
  int64_t nonzero = dataTypeSize(dtype);
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (!checkedMul(nonzero, d, &nonzero) || nonzero > kMaxTensorBytes) return false;
  }
  *bytes = empty ? 0 : nonzero;
  return true;
}

std::string quotedName(const std::string& name) {
  constexpr size_t kShown = 64;
  if (name.size() <= kShown) return "'" + name + "'";
  return "'" + name.substr(0, kShown) + "...'(" + std::to_string(name.size()) + " bytes)";
}

std::string secondsText(double seconds) {
  std::ostringstream out;
  out << std::setprecision(seconds < 10 ? 2 : 6) << seconds;
  return out.str();
}

std::string numberText(double value) {
  if (std::isnan(value)) return "nan";
  char text[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (digits == 17 || std::strtod(text, nullptr) == value) break;
  }
  return text;
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::string joinInts(const std::vector<int>& values) {
  // No ostringstream: the shm backend names its group this way on every op, and a stream's
  // construction (locale, ios init) cost more than the op's own bookkeeping.
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(values[i]);
  }
  return out;
}

std::string checkGroupRanks(const std::vector<int>& ranks, int world_size, int member) {
  if (ranks.empty()) return "expected at least one rank, got none";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size || (i > 0 && ranks[i] <= ranks[i - 1]))
      return "expected sorted, distinct ranks in [0, " + std::to_string(world_size) +
             "), got [" + joinInts(ranks) + "]";
  }
  if (member >= 0 && !std::binary_search(ranks.begin(), ranks.end(), member))
    return "this rank (" + std::to_string(member) + ") is not a member of [" + joinInts(ranks) +
           "]";
  return std::string();
}

}  // namespace tutti
