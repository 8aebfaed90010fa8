// Element-wise kernels on host memory, shared by the core (scaling, join zeros) and the
// CPU backends that need their own reduction (loopback, gloo, MPI user ops for 16-bit floats).
// float16 and bfloat16 are computed in float and rounded to nearest-even once per step.
#pragma once

#include "base/common.h"

#include <cstdint>

namespace tutti {

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

// acc[i] = acc[i] (op) in[i] for i < count. op must not be kAverage (the core turns
// average into sum + scale). bool: sum/max = logical or, min/product = logical and.
void reduceInto(void* acc, const void* in, int64_t count, DataType dtype, ReduceOp op);

// out[i] = ins[0][i] op ins[1][i] op ... op ins[n-1][i], in that order, for i < count (the
// n-way step of a shared-memory reduction). out may be ins[0] but no other input. 16-bit
// floats accumulate in float and are rounded once; other types as reduceInto.
void reduceMany(void* out, const void* const* ins, int n, int64_t count, DataType dtype,
                ReduceOp op);

// out[i] = in[i] * factor (in may equal out). float32/float64 multiply by the factor
// rounded to their own type, 16-bit floats compute in float32, integers are scaled in
// double and truncated toward zero (Horovod's CPU rules); bool is left unchanged. factor == 1 with in == out is a no-op.
void scaleInto(const void* in, void* out, int64_t count, DataType dtype, double factor);

// data[i] = data[i] / divisor, the division of an average: correctly rounded for floats
// (16-bit ones in float32), truncated toward zero for integers; bool is left unchanged.
void divideInto(void* data, int64_t count, DataType dtype, int64_t divisor);

// Element i of a host buffer as a double (16-bit floats converted, bool as 0/1), and the
// reverse (integers go through int64 and wrap, like the reduction kernels). For checks
// and references in tests and benchmarks, not for hot loops.
double loadElement(const void* buf, int64_t i, DataType dtype);
void storeElement(void* buf, int64_t i, DataType dtype, double value);

}  // namespace tutti
