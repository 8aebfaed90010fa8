#include "base/reduce.h"

// The element loops are the shm backend's hot path: let GCC vectorize them at any -O level
// (at -O2 its cost model refuses loops that need a scalar remainder). Clang vectorizes at -O2.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace tutti {

// The conversions the kernels inline: the exported names below are interposable in a shared
// library, so GCC would call them through the PLT for every element.
namespace {

inline float halfBitsToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t floatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: fine
  return static_cast<uint16_t>(half);
}

inline float bfloat16BitsToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t floatToBfloat16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace

float halfToFloat(uint16_t h) { return halfBitsToFloat(h); }
uint16_t floatToHalf(float f) { return floatToHalfBits(f); }
float bfloat16ToFloat(uint16_t b) { return bfloat16BitsToFloat(b); }
uint16_t floatToBfloat16(float f) { return floatToBfloat16Bits(f); }

namespace {

// Integer sums and products wrap around (two's complement), as MPI's and NCCL's do. Signed
// overflow is undefined in C++ and small types promote to int, so the arithmetic is done
// in an unsigned type of at least int's width.
template <typename T>
using Wrapping = std::conditional_t<
    std::is_integral<T>::value,
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned,
                       std::make_unsigned_t<std::conditional_t<std::is_integral<T>::value, T, int>>>,
    T>;

template <typename T>
void reduceTyped(T* acc, const T* in, int64_t n, ReduceOp op) {
  using W = Wrapping<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(static_cast<W>(acc[i]) + static_cast<W>(in[i]));
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], in[i]);
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
      break;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<T>(static_cast<W>(acc[i]) * static_cast<W>(in[i]));
      break;
  }
}

void reduceBool(uint8_t* acc, const uint8_t* in, int64_t n, ReduceOp op) {
  bool logical_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
  for (int64_t i = 0; i < n; ++i) {
    bool a = acc[i] != 0, b = in[i] != 0;
    acc[i] = static_cast<uint8_t>(logical_and ? (a && b) : (a || b));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce16(uint16_t* acc, const uint16_t* in, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    float a = ToFloat(acc[i]), b = ToFloat(in[i]), r = a;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: r = a + b; break;
      case ReduceOp::kMin: r = std::fmin(a, b); break;
      case ReduceOp::kMax: r = std::fmax(a, b); break;
      case ReduceOp::kProduct: r = a * b; break;
    }
    acc[i] = FromFloat(r);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce16Many(uint16_t* out, const uint16_t* const* ins, int n, int64_t count, ReduceOp op) {
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t m = std::min(kBlock, count - base);
    for (int64_t i = 0; i < m; ++i) acc[i] = ToFloat(ins[0][base + i]);
    for (int k = 1; k < n; ++k) {
      const uint16_t* in = ins[k] + base;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
          for (int64_t i = 0; i < m; ++i) acc[i] += ToFloat(in[i]);
          break;
        case ReduceOp::kMin:
          for (int64_t i = 0; i < m; ++i) acc[i] = std::fmin(acc[i], ToFloat(in[i]));
          break;
        case ReduceOp::kMax:
          for (int64_t i = 0; i < m; ++i) acc[i] = std::fmax(acc[i], ToFloat(in[i]));
          break;
        case ReduceOp::kProduct:
          for (int64_t i = 0; i < m; ++i) acc[i] *= ToFloat(in[i]);
          break;
      }
    }
    for (int64_t i = 0; i < m; ++i) out[base + i] = FromFloat(acc[i]);
  }
}

// In T's own arithmetic (the factor rounded to T first), as Horovod does: results are
// bit-identical to `tensor * torch.tensor(factor, dtype=tensor.dtype)`.
template <typename T>
void scaleFloat(const T* in, T* out, int64_t n, double factor) {
  const T f = static_cast<T>(factor);
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * f;
}

template <typename T>
void scaleInt(const T* in, T* out, int64_t n, double factor) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(std::trunc(in[i] * factor));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void scale16(const uint16_t* in, uint16_t* out, int64_t n, double factor) {
  float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) out[i] = FromFloat(ToFloat(in[i]) * f);
}

template <typename T>
void divideTyped(T* data, int64_t n, int64_t divisor) {
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / d);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divide16(uint16_t* data, int64_t n, int64_t divisor) {
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) data[i] = FromFloat(ToFloat(data[i]) / d);
}

}  // namespace

void divideInto(void* data, int64_t n, DataType dtype, int64_t divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case DataType::kUInt8: return divideTyped(static_cast<uint8_t*>(data), n, divisor);
    case DataType::kInt8: return divideTyped(static_cast<int8_t*>(data), n, divisor);
    case DataType::kUInt16: return divideTyped(static_cast<uint16_t*>(data), n, divisor);
    case DataType::kInt16: return divideTyped(static_cast<int16_t*>(data), n, divisor);
    case DataType::kInt32: return divideTyped(static_cast<int32_t*>(data), n, divisor);
    case DataType::kInt64: return divideTyped(static_cast<int64_t*>(data), n, divisor);
    case DataType::kFloat32: return divideTyped(static_cast<float*>(data), n, divisor);
    case DataType::kFloat64: return divideTyped(static_cast<double*>(data), n, divisor);
    case DataType::kFloat16:
      return divide16<halfBitsToFloat, floatToHalfBits>(static_cast<uint16_t*>(data), n, divisor);
    case DataType::kBFloat16:
      return divide16<bfloat16BitsToFloat, floatToBfloat16Bits>(static_cast<uint16_t*>(data), n, divisor);
    case DataType::kBool: return;
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
      return reduce16<halfBitsToFloat, floatToHalfBits>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, op);
    case DataType::kBFloat16:
      return reduce16<bfloat16BitsToFloat, floatToBfloat16Bits>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n, op);
    case DataType::kBool: return reduceBool(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), n, op);
  }
}

void reduceMany(void* out, const void* const* ins, int n, int64_t count, DataType dtype,
                ReduceOp op) {
  if (n <= 0 || count <= 0) return;
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    auto* o = static_cast<uint16_t*>(out);
    auto* in = reinterpret_cast<const uint16_t* const*>(ins);
    if (dtype == DataType::kFloat16)
      return reduce16Many<halfBitsToFloat, floatToHalfBits>(o, in, n, count, op);
    return reduce16Many<bfloat16BitsToFloat, floatToBfloat16Bits>(o, in, n, count, op);
  }
  if (out != ins[0]) std::memcpy(out, ins[0], static_cast<size_t>(count * dataTypeSize(dtype)));
  for (int k = 1; k < n; ++k) reduceInto(out, ins[k], count, dtype, op);
}

void scaleInto(const void* in, void* out, int64_t n, DataType dtype, double factor) {
  if (factor == 1.0) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(n * dataTypeSize(dtype)));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: return scaleInt(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), n, factor);
    case DataType::kInt8: return scaleInt(static_cast<const int8_t*>(in), static_cast<int8_t*>(out), n, factor);
    case DataType::kUInt16: return scaleInt(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), n, factor);
    case DataType::kInt16: return scaleInt(static_cast<const int16_t*>(in), static_cast<int16_t*>(out), n, factor);
    case DataType::kInt32: return scaleInt(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), n, factor);
    case DataType::kInt64: return scaleInt(static_cast<const int64_t*>(in), static_cast<int64_t*>(out), n, factor);
    case DataType::kFloat32: return scaleFloat(static_cast<const float*>(in), static_cast<float*>(out), n, factor);
    case DataType::kFloat64: return scaleFloat(static_cast<const double*>(in), static_cast<double*>(out), n, factor);
    case DataType::kFloat16:
      return scale16<halfBitsToFloat, floatToHalfBits>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), n, factor);
    case DataType::kBFloat16:
      return scale16<bfloat16BitsToFloat, floatToBfloat16Bits>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), n, factor);
    case DataType::kBool:
      if (in != out) std::memcpy(out, in, static_cast<size_t>(n));
      return;
  }
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

}  // namespace tutti
