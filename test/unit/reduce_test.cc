#include "base/reduce.h"

#include "test/catch.h"

#include <cmath>
#include <cstdint>
#include <vector>

using namespace tutti;

TEST_CASE("float16 and bfloat16 conversions are exact where representable and round to nearest even") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-08f})
    CHECK(halfToFloat(floatToHalf(f)) == f);
  CHECK(std::isinf(halfToFloat(floatToHalf(1e6f))));
  CHECK(halfToFloat(floatToHalf(2049.0f)) == 2048.0f);  // tie rounds to even
  CHECK(halfToFloat(floatToHalf(2051.0f)) == 2052.0f);
  for (float f : {0.0f, 1.0f, -3.0f, 256.0f, std::ldexp(1.0f, 100)}) CHECK(bfloat16ToFloat(floatToBfloat16(f)) == f);
  CHECK(std::isnan(bfloat16ToFloat(floatToBfloat16(std::nanf("")))));
}

TEST_CASE("16-bit floats are reduced in float, not byte-summed") {
  std::vector<uint16_t> acc = {floatToHalf(1.5f), floatToHalf(-2.0f)};
  std::vector<uint16_t> in = {floatToHalf(2.25f), floatToHalf(3.0f)};
  reduceInto(acc.data(), in.data(), 2, DataType::kFloat16, ReduceOp::kSum);
  CHECK(halfToFloat(acc[0]) == 3.75f);
  CHECK(halfToFloat(acc[1]) == 1.0f);
  std::vector<uint16_t> b = {floatToBfloat16(3.0f)}, c = {floatToBfloat16(-4.0f)};
  reduceInto(b.data(), c.data(), 1, DataType::kBFloat16, ReduceOp::kProduct);
  CHECK(bfloat16ToFloat(b[0]) == -12.0f);
}

TEST_CASE("bool reduces logically and integers scale by truncation") {
  std::vector<uint8_t> a = {0, 1, 1, 0}, b = {0, 0, 1, 1};
  auto x = a;
  reduceInto(x.data(), b.data(), 4, DataType::kBool, ReduceOp::kSum);
  CHECK(x == std::vector<uint8_t>{0, 1, 1, 1});
  x = a;
  reduceInto(x.data(), b.data(), 4, DataType::kBool, ReduceOp::kProduct);
  CHECK(x == std::vector<uint8_t>{0, 0, 1, 0});
  std::vector<int32_t> v = {7, -7, 10};
  scaleInto(v.data(), v.data(), 3, DataType::kInt32, 0.5);
  CHECK(v == std::vector<int32_t>{3, -3, 5});
  std::vector<float> f = {1, 2}, g(2);
  scaleInto(f.data(), g.data(), 2, DataType::kFloat32, 1.0);
  CHECK(g == f);
}

TEST_CASE("integer sums and products that overflow wrap around, never undefined") {
  int64_t acc64[2] = {INT64_MAX, int64_t(1) << 62}, in64[2] = {1, 4};
  reduceInto(acc64, in64, 1, DataType::kInt64, ReduceOp::kSum);
  reduceInto(acc64 + 1, in64 + 1, 1, DataType::kInt64, ReduceOp::kProduct);
  CHECK(acc64[0] == INT64_MIN);
  CHECK(acc64[1] == 0);
  int32_t acc32 = INT32_MAX, in32 = 2;
  reduceInto(&acc32, &in32, 1, DataType::kInt32, ReduceOp::kProduct);
  CHECK(acc32 == -2);
  uint16_t acc16 = 65535, in16 = 65535;  // promoted to int, this product once overflowed int
  reduceInto(&acc16, &in16, 1, DataType::kUInt16, ReduceOp::kProduct);
  CHECK(acc16 == 1);
}

TEST_CASE("scaling uses the factor in the tensor's own type; average divides exactly") {
  // float32: x * float(f), bit-identical to torch's tensor * tensor(f, dtype=float32).
  const double f = 0.3183098861837907;
  std::vector<float> x = {71.0f, -94.0f, 65.0f};
  std::vector<float> out(3);
  scaleInto(x.data(), out.data(), 3, DataType::kFloat32, f);
  for (int i = 0; i < 3; ++i) CHECK(out[i] == x[i] * static_cast<float>(f));
  // Average: a correctly rounded division (142 * float(1/3) != 142 / 3 in float).
  std::vector<float> sum = {142.0f, 130.0f};
  divideInto(sum.data(), 2, DataType::kFloat32, 3);
  CHECK(sum[0] == 142.0f / 3.0f);
  CHECK(sum[1] == 130.0f / 3.0f);
  std::vector<int32_t> ints = {-7, 7, 6};
  divideInto(ints.data(), 3, DataType::kInt32, 2);
  CHECK(ints == std::vector<int32_t>{-3, 3, 3});
  std::vector<uint16_t> half = {floatToHalf(3.0f)};
  divideInto(half.data(), 1, DataType::kFloat16, 3);
  CHECK(halfToFloat(half[0]) == halfToFloat(floatToHalf(1.0f)));
}
