// Deterministic per-rank inputs and the references they imply, for -c 1.
// Inputs are small integers (1..4; {1,2} for products; 0/1 for bool) so that every dtype
// holds them and every reduction of them exactly; only average rounds, and the reference
// scales by the rule the runtime documents for an average (bench/elements.h, scaleInPlace)
// so the check compares transports, not rounding conventions.
#pragma once

#include <tutti/tutti.hpp>

#include <cstdint>

namespace tutti {
namespace bench {

// The input of `rank` at global element `index` (an index into the logical tensor, so that
// references for allgather/alltoall/reducescatter can name any rank's elements).
double inputValue(int rank, int64_t index, ReduceOp op, DataType dtype);

double loadValue(const void* buf, int64_t i, DataType dtype);
void storeValue(void* buf, int64_t i, DataType dtype, double value);

// buf[i] = inputValue(rank, first_index + i) for i < count.
void fillInput(void* buf, int64_t count, DataType dtype, ReduceOp op, int rank,
               int64_t first_index);
// buf[i] = op over ranks 0..nranks-1 of inputValue(r, first_index + i) (average: sum, then
// scaled by 1/nranks in the dtype).
void fillReduced(void* buf, int64_t count, DataType dtype, ReduceOp op, int nranks,
                 int64_t first_index);
// Elements of `got` that differ from `expected` (floats within a dtype-sized tolerance).
int64_t countWrong(const void* got, const void* expected, int64_t count, DataType dtype);

}  // namespace bench
}  // namespace tutti
