#include "bench/data.h"

#include "bench/elements.h"

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
  return loadElement(buf, i, dtype);
}

void storeValue(void* buf, int64_t i, DataType dtype, double value) {
  storeElement(buf, i, dtype, value);
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
    scaleInPlace(buf, count, dtype, 1.0 / nranks);
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
