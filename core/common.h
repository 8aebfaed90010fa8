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

int64_t dataTypeBytes(DataType dtype);
bool isFloatingPoint(DataType dtype);  // float16, bfloat16, float32, float64
bool isValidDataType(int dtype);
bool isValidReduceOp(int op);

std::string shapeString(const std::vector<int64_t>& shape);  // "[4,8]"
int64_t shapeElements(const std::vector<int64_t>& shape);   // product; 1 for []
std::string secondsText(double seconds);                      // "0.5", "120"
std::string joinInts(const std::vector<int>& values);           // "0, 2, 3"

}  // namespace tutti
