// Pure facts about what NCCL can carry: which (op, dtype, device) the NCCL backend accepts,
// the NCCL element type a Tutti dtype travels as, and the NCCL reduction for a Tutti one.
// No CUDA calls here, so the tests check these tables on machines without a GPU.
#pragma once

#include "backends/backend.h"
#include "base/common.h"

#include <nccl.h>

#include <cstdint>
#include <string>

namespace tutti {
namespace detail {

// bfloat16 arrived in NCCL 2.10 (version code 21000).
constexpr int kNcclBfloat16Version = 21000;

// How a Tutti dtype moves through NCCL: `items_per_element` NCCL items of `type` per element.
// int16/uint16 have no NCCL type; they move as 2 x uint8 (data movement only, no reduction).
struct NcclWireType {
  ncclDataType_t type;
  int64_t items_per_element;
};

// True for CUDA tensors only. Reductions (allreduce, reducescatter): int8, uint8, int32,
// int64, float16, float32, float64, bfloat16 (NCCL >= 2.10) and bool (as uint8 with max/min).
// Data movement (allgather, broadcast, alltoall) also takes int16/uint16. Barrier: any dtype.
// Join: never (the core runs it).
bool ncclSupports(OpType op, DataType dtype, DeviceType device, int nccl_version);

// Throws Error(kUnsupported) naming the op for a dtype NCCL cannot carry for it.
NcclWireType ncclWireType(OpType op, DataType dtype, int nccl_version);

// sum/min/max/product; bool reduces as uint8: sum/max = logical or (max), min/product =
// logical and (min). Throws Error(kInvalidArgument) for kAverage (the core sends sum + scale).
ncclRedOp_t ncclReduceOp(ReduceOp op, DataType dtype);

// How the NCCL backend applies a reduction's scaling (backend.h) inside the collective:
//   kPlain      none to apply (trivial scaling, or bool, which the CPU kernels leave unscaled
//               too);
//   kAverage    ncclAvg (NCCL >= 2.10), where the divisor is the member count: the sum divided
//               by it (integers divide the sum, as the CPU kernels do);
//   kPreMulSum  ncclRedOpCreatePreMulSum (NCCL >= 2.11): every input multiplied by `factor`
//               (prescale * postscale / divisor) before the sum; integers only with an
//               integral factor and no average;
//   kUnsupported with `why`: scaled min/max/product, a fractional factor or an average
//               with scale factors on integers, or an NCCL too old.
struct NcclScalingPlan {
  enum Kind { kPlain, kAverage, kPreMulSum, kUnsupported } kind = kPlain;
  double factor = 1.0;
  std::string why;
};
NcclScalingPlan ncclScalingPlan(DataType dtype, ReduceOp op, const ReduceScaling& scaling,
                                int members, int nccl_version);

// ncclAvg arrived in NCCL 2.10, ncclRedOpCreatePreMulSum in 2.11.
constexpr int kNcclAvgVersion = 21000;
constexpr int kNcclPreMulSumVersion = 21100;

// 22809 -> "2.28.9"
std::string ncclVersionString(int version_code);

}  // namespace detail
}  // namespace tutti
