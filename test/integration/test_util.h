// Helpers for the multi-process integration tests: host tensors of every dtype, inputs that
// every rank can compute for every other rank (so references need no communication), exact
// or tolerance comparison, and init/wait shorthands. Uses only the public API.
#pragma once

#include <tutti/tutti.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {
namespace itest {

// Waits used by the tests: well under the CTest deadline, above any sane op latency.
constexpr double kWaitSeconds = 60.0;

const std::vector<DataType>& allDataTypes();
const std::vector<ReduceOp>& allReduceOps();
const char* opName(ReduceOp op);  // "sum", "average", ...
bool isFloat(DataType dtype);
bool isSigned(DataType dtype);

// IEEE half and bfloat16 conversions, round to nearest even (independent of the core's).
uint16_t toHalf(double value);
double fromHalf(uint16_t bits);
uint16_t toBfloat16(double value);
double fromBfloat16(uint16_t bits);

// A dense host tensor that owns its bytes. Elements are read and written as double.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DataType dtype, std::vector<int64_t> shape);
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return nbytes_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  double get(int64_t i) const;
  void set(int64_t i, double value);  // rounds to the dtype (fp16/bf16: nearest even)
  void fill(double value);
  TensorView view();

 private:
  DataType dtype_ = DataType::kFloat32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  int64_t nbytes_ = 0;
  std::vector<unsigned char> bytes_;
};

// A deterministic input element of `rank` for (seed, index), exactly representable in dtype
// and small enough that reducing `op` over 4 ranks with scale factors up to 3 cannot
// overflow (product: values in {-1, 1, 2} or {1, 2}; bool: 0/1).
double inputValue(DataType dtype, ReduceOp op, int rank, uint64_t seed, int64_t index);
// Fills t with inputValue(dtype, op, rank, seed, offset + i).
void fillInput(HostTensor& t, ReduceOp op, int rank, uint64_t seed, int64_t offset = 0);

// The reference: postscale * reduce_{r in ranks}(prescale * x_r), average divides by
// `divisor` (integers truncate toward zero at each scaling, bool: or/and), then rounded to
// dtype through HostTensor::set.
double referenceReduce(DataType dtype, ReduceOp op, const std::vector<double>& inputs,
                       double prescale, double postscale, int divisor);

// "" when got matches expected (exact for integers/bool, relative tolerance for floats),
// else a description of the first mismatches: "index 3: expected 2 got 5; ...".
std::string compare(const HostTensor& expected, const void* got, int64_t count,
                    const std::string& what);
double tolerance(DataType dtype);

// Calls tutti::init() and fails the test case when it fails. Idempotent.
void requireInit();
// Waits with kWaitSeconds; on failure the returned status says so.
Status waitFor(Handle handle, Result* result = nullptr);
std::string describe(const Status& status);
std::string listText(const std::vector<int64_t>& values);  // "[4,8]"
std::string listText(const std::vector<int>& values);  // "kMismatch: message"
const char* codeName(StatusCode code);

// Milliseconds since the epoch on the system clock (the same clock for every local rank).
int64_t wallMicros();
void sleepMillis(int ms);

}  // namespace itest
}  // namespace tutti
