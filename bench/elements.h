// The elements of host buffers, for tutti-bench's references and checks and for the bare
// baselines' 16-bit-float and bool reductions (gloo and MPI have none). Written here, apart
// from the runtime's kernels, so that the checker does not share the code it checks.
// float16 and bfloat16 are computed in float and rounded to nearest-even once per step.
#pragma once

#include <tutti/tutti.hpp>

#include <cstdint>

namespace tutti {
namespace bench {

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);  // nearest-even; overflow to inf; NaN stays NaN
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);  // nearest-even; NaN stays NaN

// Element i of a host buffer as a double (16-bit floats converted, bool as 0/1), and the
// reverse (integers go through int64 and wrap; bool stores value != 0).
double loadElement(const void* buf, int64_t i, DataType dtype);
void storeElement(void* buf, int64_t i, DataType dtype, double value);

// acc[i] = acc[i] (op) in[i] for i < count. Average reduces as sum (the caller scales).
// Integers wrap; bool: sum/max = logical or, min/product = logical and.
void reduceInto(void* acc, const void* in, int64_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, by Horovod's CPU rules, which the runtime follows for an average:
// float32/float64 multiply by the factor rounded to their own type, 16-bit floats compute in
// float32, integers are scaled in double and truncated toward zero; bool is unchanged.
void scaleInPlace(void* buf, int64_t count, DataType dtype, double factor);

}  // namespace bench
}  // namespace tutti
