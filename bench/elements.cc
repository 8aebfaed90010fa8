#include "bench/elements.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace tutti {
namespace bench {
namespace {

uint32_t bitsOf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}

float floatOf(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

// `value` >> `shift` (1..31) rounded to nearest, ties to even.
uint32_t shiftRounded(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// Integer sums and products wrap (two's complement) as MPI's and NCCL's do: computed in an
// unsigned type at least as wide as int, so that neither overflow nor promotion is undefined.
template <typename T, bool = std::is_integral<T>::value>
struct WrappingOf {
  using type = T;
};
template <typename T>
struct WrappingOf<T, true> {
  using type = std::make_unsigned_t<std::common_type_t<T, int>>;
};
template <typename T>
using Wrapping = typename WrappingOf<T>::type;

template <typename T>
void reduceTyped(T* acc, const T* in, int64_t n, ReduceOp op) {
  using W = Wrapping<T>;
  for (int64_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc[i] = static_cast<T>(W(acc[i]) + W(in[i])); break;
      case ReduceOp::kMin: acc[i] = std::min(acc[i], in[i]); break;
      case ReduceOp::kMax: acc[i] = std::max(acc[i], in[i]); break;
      case ReduceOp::kProduct: acc[i] = static_cast<T>(W(acc[i]) * W(in[i])); break;
    }
  }
}

// One loop per op, so that the op is not decided per element (the baselines time this).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), typename Op>
void reduce16With(uint16_t* acc, const uint16_t* in, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) acc[i] = FromFloat(op(ToFloat(acc[i]), ToFloat(in[i])));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce16(uint16_t* acc, const uint16_t* in, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return reduce16With<ToFloat, FromFloat>(acc, in, n, [](float a, float b) { return a + b; });
    case ReduceOp::kMin:
      return reduce16With<ToFloat, FromFloat>(acc, in, n, [](float a, float b) { return std::fmin(a, b); });
    case ReduceOp::kMax:
      return reduce16With<ToFloat, FromFloat>(acc, in, n, [](float a, float b) { return std::fmax(a, b); });
    case ReduceOp::kProduct:
      return reduce16With<ToFloat, FromFloat>(acc, in, n, [](float a, float b) { return a * b; });
  }
}

void reduceBool(uint8_t* acc, const uint8_t* in, int64_t n, ReduceOp op) {
  const bool logical_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
  for (int64_t i = 0; i < n; ++i) {
    const bool a = acc[i] != 0, b = in[i] != 0;
    acc[i] = static_cast<uint8_t>(logical_and ? (a && b) : (a || b));
  }
}

template <typename T>
void scaleTyped(T* buf, int64_t n, double factor) {
  if constexpr (std::is_integral<T>::value) {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<T>(std::trunc(buf[i] * factor));
  } else {
    const T f = static_cast<T>(factor);
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] * f);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void scale16(uint16_t* buf, int64_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) buf[i] = FromFloat(ToFloat(buf[i]) * f);
}

}  // namespace

// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; float32: 1, 8 (bias 127), 23.
float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return floatOf(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp != 0) return floatOf(sign | ((exp + 127 - 15) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24, exact in float
  const float magnitude = std::ldexp(static_cast<float>(mant), -24);
  return sign ? -magnitude : magnitude;
}

uint16_t floatToHalf(float f) {
  const uint32_t x = bitsOf(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  const uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;  // the half's biased exponent
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // a half subnormal (or zero): the 24-bit significand shifted into 10 bits
    if (e < -10) return static_cast<uint16_t>(sign);
    return static_cast<uint16_t>(sign | shiftRounded(mant | 0x800000u, static_cast<uint32_t>(14 - e)));
  }
  // A carry out of the mantissa raises the exponent, up to inf: both are right.
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(e) << 10) + shiftRounded(mant, 13)));
}

float bfloat16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }

uint16_t floatToBfloat16(float f) {
  const uint32_t x = bitsOf(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>(shiftRounded(x, 16));  // a carry into the exponent is right
}

double loadElement(const void* buf, int64_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(buf)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: return bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kBool: return static_cast<const uint8_t*>(buf)[i] != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

void storeElement(void* buf, int64_t i, DataType dtype, double value) {
  const int64_t iv = static_cast<int64_t>(value);
  switch (dtype) {
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(iv); break;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(iv); break;
    case DataType::kUInt16: static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(iv); break;
    case DataType::kInt16: static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(iv); break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(iv); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = iv; break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(value));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = floatToBfloat16(static_cast<float>(value));
      break;
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(value); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = value; break;
    case DataType::kBool: static_cast<uint8_t*>(buf)[i] = value != 0.0 ? 1 : 0; break;
  }
}

void reduceInto(void* acc, const void* in, int64_t n, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: return reduceTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), n, op);
    case DataType::kInt8: return reduceTyped(static_cast<int8_t*>(acc), static_cast<const int8_t*>(in), n, op);
    case DataType::kUInt16: return reduceTyped(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, op);
    case DataType::kInt16: return reduceTyped(static_cast<int16_t*>(acc), static_cast<const int16_t*>(in), n, op);
    case DataType::kInt32: return reduceTyped(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n, op);
    case DataType::kInt64: return reduceTyped(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), n, op);
    case DataType::kFloat32: return reduceTyped(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case DataType::kFloat64: return reduceTyped(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
    case DataType::kFloat16:
      return reduce16<halfToFloat, floatToHalf>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, op);
    case DataType::kBFloat16:
      return reduce16<bfloat16ToFloat, floatToBfloat16>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, op);
    case DataType::kBool:
      return reduceBool(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), n, op);
  }
}

void scaleInPlace(void* buf, int64_t n, DataType dtype, double factor) {
  if (factor == 1.0) return;
  switch (dtype) {
    case DataType::kUInt8: return scaleTyped(static_cast<uint8_t*>(buf), n, factor);
    case DataType::kInt8: return scaleTyped(static_cast<int8_t*>(buf), n, factor);
    case DataType::kUInt16: return scaleTyped(static_cast<uint16_t*>(buf), n, factor);
    case DataType::kInt16: return scaleTyped(static_cast<int16_t*>(buf), n, factor);
    case DataType::kInt32: return scaleTyped(static_cast<int32_t*>(buf), n, factor);
    case DataType::kInt64: return scaleTyped(static_cast<int64_t*>(buf), n, factor);
    case DataType::kFloat32: return scaleTyped(static_cast<float*>(buf), n, factor);
    case DataType::kFloat64: return scaleTyped(static_cast<double*>(buf), n, factor);
    case DataType::kFloat16: return scale16<halfToFloat, floatToHalf>(static_cast<uint16_t*>(buf), n, factor);
    case DataType::kBFloat16:
      return scale16<bfloat16ToFloat, floatToBfloat16>(static_cast<uint16_t*>(buf), n, factor);
    case DataType::kBool: return;
  }
}

}  // namespace bench
}  // namespace tutti
