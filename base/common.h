// Types shared by the core and the backends: op kinds, errors, deadlines, dtype facts.
#pragma once

#include <tutti/tutti.hpp>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tutti {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kAddProcessSet = 7,     // negotiated on the global set, like a tensor
  kRemoveProcessSet = 8,
};
constexpr int kNumOpTypes = 9;

const char* opTypeName(OpType op);
const char* reduceOpName(ReduceOp op);
const char* deviceTypeName(DeviceType device);

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
Deadline deadlineAfter(double seconds);
// Seconds left before `deadline` (negative once passed).
double secondsLeft(Deadline deadline);

// The exception used inside Tutti. Converted to Status at every public edge.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }
  Status status() const { return Status(code_, what()); }

 private:
  StatusCode code_;
};

[[noreturn]] void throwError(StatusCode code, const std::string& message);

bool isValidDataType(int dtype);
bool isValidReduceOp(int op);

std::string shapeString(const std::vector<int64_t>& shape);  // "[4,8]"
int64_t shapeElements(const std::vector<int64_t>& shape);   // product; 1 for []

// Sizes. No tensor may exceed kMaxTensorBytes (TUTTI_MAX_TENSOR_BYTES, 2^56): more than any
// process can address (x86-64 and aarch64 user space is at most 2^56 bytes even with
// 5-level paging), so a larger size is a caller's mistake, and every byte count computed
// from a valid shape (sums over ranks included) fits in int64 with room to spare.
constexpr int64_t kMaxTensorBytes = TUTTI_MAX_TENSOR_BYTES;
// a * b or a + b into *out; false (and *out untouched) when the result does not fit int64.
bool checkedMul(int64_t a, int64_t b, int64_t* out);
bool checkedAdd(int64_t a, int64_t b, int64_t* out);
// The bytes of a tensor of `shape` and `dtype` into *bytes; false when a dimension is
// negative or the size exceeds kMaxTensorBytes. Zero-sized dimensions do not hide the
// others: [0, 2^62, 2^62] is refused too, so any product of the dimensions is safe.
bool tensorBytes(const std::vector<int64_t>& shape, DataType dtype, int64_t* bytes);
// A name for messages: 'name', or its first 64 bytes and "...'(N bytes)" when longer.
std::string quotedName(const std::string& name);
std::string secondsText(double seconds);                      // "0.5", "120"
// The shortest text that reads back as `value` (up to 17 digits): "0.5", "0.1",
// "0.30000000000000004", "nan", "inf". For messages that compare two values.
std::string numberText(double value);
std::string joinInts(const std::vector<int>& values);           // "0, 2, 3"
// FNV-1a (64 bits) of `n` bytes at `data`, continuing from `h` (start with kFnvBasis): a
// name for keys and signatures, the same on every rank and build. Not cryptographic.
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvBasis);
// What is wrong with the world ranks of a group (a process set): empty when `ranks` is not
// empty, sorted, distinct, within [0, world_size) and (member >= 0) includes `member`; else
// "expected sorted, distinct ranks in [0, 4), got [2, 1]" or "this rank (3) is not a member
// of [0, 1]".
std::string checkGroupRanks(const std::vector<int>& ranks, int world_size, int member = -1);

}  // namespace tutti
