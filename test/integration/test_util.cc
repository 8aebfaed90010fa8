#include "test/integration/test_util.h"

#define CATCH_CONFIG_EXTERNAL_INTERFACES  // TestEventListenerBase, for the shutdown listener
#include "test/catch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

namespace tutti {
namespace itest {

const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> kAll = {
      DataType::kUInt8,   DataType::kInt8,     DataType::kUInt16,  DataType::kInt16,
      DataType::kInt32,   DataType::kInt64,    DataType::kFloat16, DataType::kBFloat16,
      DataType::kFloat32, DataType::kFloat64, DataType::kBool};
  return kAll;
}

const std::vector<ReduceOp>& allReduceOps() {
  static const std::vector<ReduceOp> kAll = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};
  return kAll;
}

const char* opName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

bool isFloat(DataType d) {
  return d == DataType::kFloat16 || d == DataType::kBFloat16 || d == DataType::kFloat32 ||
         d == DataType::kFloat64;
}

bool isSigned(DataType d) {
  return d == DataType::kInt8 || d == DataType::kInt16 || d == DataType::kInt32 ||
         d == DataType::kInt64 || isFloat(d);
}

uint16_t toHalf(double value) {
  float f = static_cast<float>(value);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past max
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    float af;
    std::memcpy(&af, &abs, 4);
    // Scale so one half-subnormal ulp (2^-24) becomes 1.0, then round to nearest even.
    float scaled = af * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

double fromHalf(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<double>(mant + 1024), exp - 25);
  }
  return (h & 0x8000) ? -v : v;
}

uint16_t toBfloat16(double value) {
  float f = static_cast<float>(value);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

double fromBfloat16(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

static int64_t elementSize(DataType d) {
  switch (d) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kUInt16: case DataType::kInt16: case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kFloat64: return 8;
  }
  return 0;
}

HostTensor::HostTensor(DataType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t d : shape_) numel_ *= d;
  nbytes_ = numel_ * elementSize(dtype);
  // At least 8 bytes so that data() is never null, even for 0 elements. 0xA5 filler makes
  // an output the runtime forgot to write visible.
  bytes_.assign(static_cast<size_t>(std::max<int64_t>(nbytes_, 8)), 0xA5);
}

template <typename T>
static T load(const unsigned char* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
static void store(unsigned char* p, int64_t i, T v) {
  std::memcpy(p + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

static double getAt(const unsigned char* p, DataType d, int64_t i) {
  switch (d) {
    case DataType::kUInt8: return load<uint8_t>(p, i);
    case DataType::kInt8: return load<int8_t>(p, i);
    case DataType::kUInt16: return load<uint16_t>(p, i);
    case DataType::kInt16: return load<int16_t>(p, i);
    case DataType::kInt32: return load<int32_t>(p, i);
    case DataType::kInt64: return static_cast<double>(load<int64_t>(p, i));
    case DataType::kFloat16: return fromHalf(load<uint16_t>(p, i));
    case DataType::kBFloat16: return fromBfloat16(load<uint16_t>(p, i));
    case DataType::kFloat32: return load<float>(p, i);
    case DataType::kFloat64: return load<double>(p, i);
    case DataType::kBool: return load<uint8_t>(p, i);  // raw byte: 2 would be a bug
  }
  return NAN;
}

double HostTensor::get(int64_t i) const { return getAt(bytes_.data(), dtype_, i); }

void HostTensor::set(int64_t i, double v) {
  unsigned char* p = bytes_.data();
  switch (dtype_) {
    case DataType::kUInt8: store<uint8_t>(p, i, static_cast<uint8_t>(v)); break;
    case DataType::kInt8: store<int8_t>(p, i, static_cast<int8_t>(v)); break;
    case DataType::kUInt16: store<uint16_t>(p, i, static_cast<uint16_t>(v)); break;
    case DataType::kInt16: store<int16_t>(p, i, static_cast<int16_t>(v)); break;
    case DataType::kInt32: store<int32_t>(p, i, static_cast<int32_t>(v)); break;
    case DataType::kInt64: store<int64_t>(p, i, static_cast<int64_t>(v)); break;
    case DataType::kFloat16: store<uint16_t>(p, i, toHalf(v)); break;
    case DataType::kBFloat16: store<uint16_t>(p, i, toBfloat16(v)); break;
    case DataType::kFloat32: store<float>(p, i, static_cast<float>(v)); break;
    case DataType::kFloat64: store<double>(p, i, v); break;
    case DataType::kBool: store<uint8_t>(p, i, v != 0 ? 1 : 0); break;
  }
}

void HostTensor::fill(double value) {
  for (int64_t i = 0; i < numel_; ++i) set(i, value);
}

TensorView HostTensor::view() {
  TensorView v;
  v.data = bytes_.data();
  v.dtype = dtype_;
  v.shape = shape_;
  return v;
}

static uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// An integer in [lo, hi] from (rank, seed, index).
static int64_t pick(int rank, uint64_t seed, int64_t index, int64_t lo, int64_t hi) {
  uint64_t h = mix(mix(seed * 1000003ull + static_cast<uint64_t>(rank)) ^
                   static_cast<uint64_t>(index));
  return lo + static_cast<int64_t>(h % static_cast<uint64_t>(hi - lo + 1));
}

double inputValue(DataType d, ReduceOp op, int rank, uint64_t seed, int64_t index) {
  if (d == DataType::kBool) return static_cast<double>(pick(rank, seed, index, 0, 1));
  if (op == ReduceOp::kProduct) {
    if (isFloat(d)) {
      static const double kFloatFactors[] = {-1.0, 0.5, 1.0, 2.0};
      return kFloatFactors[pick(rank, seed, index, 0, 3)];
    }
    if (isSigned(d)) {
      static const double kIntFactors[] = {-1.0, 1.0, 2.0};
      return kIntFactors[pick(rank, seed, index, 0, 2)];
    }
    return static_cast<double>(pick(rank, seed, index, 1, 2));
  }
  switch (d) {
    case DataType::kUInt8: return static_cast<double>(pick(rank, seed, index, 0, 5));
    case DataType::kInt8: return static_cast<double>(pick(rank, seed, index, -3, 3));
    case DataType::kUInt16: return static_cast<double>(pick(rank, seed, index, 0, 500));
    case DataType::kInt16: return static_cast<double>(pick(rank, seed, index, -500, 500));
    case DataType::kInt32: return static_cast<double>(pick(rank, seed, index, -100000, 100000));
    case DataType::kInt64:
      return static_cast<double>(pick(rank, seed, index, -1000000000000ll, 1000000000000ll));
    case DataType::kFloat16:
    case DataType::kBFloat16: return pick(rank, seed, index, -16, 16) / 2.0;
    case DataType::kFloat32: return pick(rank, seed, index, -4000, 4000) / 4.0;
    case DataType::kFloat64: return pick(rank, seed, index, -8000000, 8000000) / 8.0;
    case DataType::kBool: break;
  }
  return 0.0;
}

void fillInput(HostTensor& t, ReduceOp op, int rank, uint64_t seed, int64_t offset) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, inputValue(t.dtype(), op, rank, seed, offset + i));
}

static double scaleValue(DataType d, double v, double factor) {
  if (d == DataType::kBool || factor == 1.0) return v;
  double s = v * factor;
  return isFloat(d) ? s : std::trunc(s);
}

double referenceReduce(DataType d, ReduceOp op, const std::vector<double>& inputs,
                       double prescale, double postscale, int divisor) {
  double acc = 0.0;
  bool first = true;
  for (double raw : inputs) {
    double x = scaleValue(d, raw, prescale);
    if (first) {
      acc = x;
      first = false;
      continue;
    }
    if (d == DataType::kBool) {
      bool a = acc != 0, b = x != 0;
      acc = (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? (a && b) : (a || b);
      continue;
    }
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAverage: acc += x; break;
      case ReduceOp::kMin: acc = std::min(acc, x); break;
      case ReduceOp::kMax: acc = std::max(acc, x); break;
      case ReduceOp::kProduct: acc *= x; break;
    }
  }
  if (op == ReduceOp::kAverage) {
    acc = isFloat(d) ? acc / divisor : std::trunc(acc / divisor);
  }
  acc = scaleValue(d, acc, postscale);
  HostTensor one(d, {1});
  one.set(0, acc);
  return one.get(0);
}

double tolerance(DataType d) {
  switch (d) {
    case DataType::kFloat16: return 4e-3;
    case DataType::kBFloat16: return 2e-2;
    case DataType::kFloat32: return 1e-5;
    case DataType::kFloat64: return 1e-12;
    default: return 0.0;
  }
}

std::string compare(const HostTensor& expected, const void* got, int64_t count,
                    const std::string& what) {
  std::ostringstream out;
  if (count != expected.numel()) {
    out << what << ": expected " << expected.numel() << " elements, got " << count;
    return out.str();
  }
  if (count > 0 && got == nullptr) return what + ": output pointer is null";
  const auto* p = static_cast<const unsigned char*>(got);
  const double tol = tolerance(expected.dtype());
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    double e = expected.get(i), g = getAt(p, expected.dtype(), i);
    bool ok = tol == 0.0 ? e == g : std::fabs(e - g) <= tol * std::max(1.0, std::fabs(e));
    if (ok) continue;
    if (bad < 5) {
      if (bad == 0) out << what << " (" << dataTypeName(expected.dtype()) << "): ";
      out << "index " << i << ": expected " << e << " got " << g << "; ";
    }
    ++bad;
  }
  if (bad > 0) out << bad << " of " << count << " elements wrong";
  return out.str();
}

void requireInit() {
  Status s = init();
  INFO("tutti::init(): " << describe(s));
  REQUIRE(s.ok());
  REQUIRE(isInitialized());
}

Status waitFor(Handle handle, Result* result) { return wait(handle, kWaitSeconds, result); }

const char* codeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "kOk";
    case StatusCode::kInvalidArgument: return "kInvalidArgument";
    case StatusCode::kMismatch: return "kMismatch";
    case StatusCode::kTimeout: return "kTimeout";
    case StatusCode::kAborted: return "kAborted";
    case StatusCode::kNotInitialized: return "kNotInitialized";
    case StatusCode::kBackend: return "kBackend";
    case StatusCode::kUnsupported: return "kUnsupported";
    case StatusCode::kInProgress: return "kInProgress";
    case StatusCode::kJoined: return "kJoined";
    case StatusCode::kDuplicateName: return "kDuplicateName";
    case StatusCode::kInternal: return "kInternal";
  }
  return "unknown-code";
}

std::string describe(const Status& s) {
  return std::string(codeName(s.code())) + (s.message().empty() ? "" : ": " + s.message());
}

std::string listText(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

std::string listText(const std::vector<int>& values) {
  return listText(std::vector<int64_t>(values.begin(), values.end()));
}

int64_t wallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void sleepMillis(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace itest
}  // namespace tutti

// Shuts the runtime down once every test case of the binary has run, so that MPI is
// finalized before the process exits (mpirun treats a missing finalize as a failure).
struct ShutdownListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(Catch::TestRunStats const& stats) override {
    tutti::Status s = tutti::shutdown();
    if (!s.ok()) Catch::cerr() << "tutti::shutdown(): " << tutti::itest::describe(s) << "\n";
    TestEventListenerBase::testRunEnded(stats);
  }
};
CATCH_REGISTER_LISTENER(ShutdownListener)
