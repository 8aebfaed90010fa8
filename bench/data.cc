#include "bench/data.h"

#include "core/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tutti {
namespace bench {

double inputValue(int rank, int64_t index, ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) return ((index + 2 * rank + index / 3) % 3) != 0 ? 1.0 : 0.0;
  if (op == ReduceOp::kProduct) return static_cast<double>(1 + (index * 3 + rank + index / 5) % 2);
  return static_cast<double>(1 + (index * 5 + rank * 3 + index / 7) % 4);
}

double loadValue(const void* buf, int64_t i, DataType dtype) {
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

void storeValue(void* buf, int64_t i, DataType dtype, double value) {
  // Integers wrap like the reduction kernels do (sums of many ranks may exceed int8).
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

void fillInput(void* buf, int64_t count, DataType dtype, ReduceOp op, int rank,
               int64_t first_index) {
  for (int64_t i = 0; i < count; ++i) {
    storeValue(buf, i, dtype, inputValue(rank, first_index + i, op, dtype));
  }
}

void fillReduced(void* buf, int64_t count, DataType dtype, ReduceOp op, int nranks,
                 int64_t first_index) {
  const bool is_bool = dtype == DataType::kBool;
  for (int64_t i = 0; i < count; ++i) {
    double acc = inputValue(0, first_index + i, op, dtype);
    for (int r = 1; r < nranks; ++r) {
      const double v = inputValue(r, first_index + i, op, dtype);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage: acc = is_bool ? std::max(acc, v) : acc + v; break;
        case ReduceOp::kProduct: acc = is_bool ? std::min(acc, v) : acc * v; break;
        case ReduceOp::kMin: acc = std::min(acc, v); break;
        case ReduceOp::kMax: acc = std::max(acc, v); break;
      }
    }
    storeValue(buf, i, dtype, acc);
  }
  if (op == ReduceOp::kAverage && nranks > 1) {
    scaleInto(buf, buf, count, dtype, 1.0 / nranks);
  }
}

int64_t countWrong(const void* got, const void* expected, int64_t count, DataType dtype) {
  double tolerance = 0.0;
  switch (dtype) {
    case DataType::kFloat16: tolerance = 1e-3; break;
    case DataType::kBFloat16: tolerance = 1e-2; break;
    case DataType::kFloat32: tolerance = 1e-6; break;
    case DataType::kFloat64: tolerance = 1e-12; break;
    default: break;
  }
  if (tolerance == 0.0) {
    const int64_t bytes = count * dataTypeSize(dtype);
    if (std::memcmp(got, expected, static_cast<size_t>(bytes)) == 0) return 0;
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = loadValue(got, i, dtype);
    const double e = loadValue(expected, i, dtype);
    // NaN fails both comparisons: counted wrong.
    if (!(std::fabs(g - e) <= tolerance * std::max(1.0, std::fabs(e)))) ++wrong;
  }
  return wrong;
}

}  // namespace bench
}  // namespace tutti
