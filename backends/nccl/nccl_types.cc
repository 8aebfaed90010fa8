#include "backends/nccl/nccl_types.h"

#include <cmath>

namespace tutti {
namespace detail {

namespace {

bool isReduction(OpType op) { return op == OpType::kAllreduce || op == OpType::kReducescatter; }

bool isDataMovement(OpType op) {
  return op == OpType::kAllgather || op == OpType::kBroadcast || op == OpType::kAlltoall;
}

}  // namespace

bool ncclSupports(OpType op, DataType dtype, DeviceType device, int nccl_version) {
  if (device != DeviceType::kCuda) return false;
  if (op == OpType::kBarrier) return true;
  if (!isReduction(op) && !isDataMovement(op)) return false;
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBool: return true;
    case DataType::kBFloat16:
#if NCCL_VERSION_CODE >= 21000
      return nccl_version >= kNcclBfloat16Version;
#else
      (void)nccl_version;
      return false;
#endif
    case DataType::kUInt16:
    case DataType::kInt16: return isDataMovement(op);
  }
  return false;
}

NcclWireType ncclWireType(OpType op, DataType dtype, int nccl_version) {
  if (!ncclSupports(op, dtype, DeviceType::kCuda, nccl_version))
    throwError(StatusCode::kUnsupported,
               std::string("NCCL ") + opTypeName(op) + " of " + dataTypeName(dtype) +
                   " tensors: NCCL " + ncclVersionString(nccl_version) +
                   " has no such type for this op (supported: int8, uint8, int32, int64, "
                   "float16, bfloat16 from NCCL 2.10, float32, float64, bool; int16/uint16 "
                   "for allgather, broadcast and alltoall only)");
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kBool: return {ncclUint8, 1};
    case DataType::kInt8: return {ncclInt8, 1};
    case DataType::kInt32: return {ncclInt32, 1};
    case DataType::kInt64: return {ncclInt64, 1};
    case DataType::kFloat16: return {ncclFloat16, 1};
#if NCCL_VERSION_CODE >= 21000
    case DataType::kBFloat16: return {ncclBfloat16, 1};
#endif
    case DataType::kFloat32: return {ncclFloat32, 1};
    case DataType::kFloat64: return {ncclFloat64, 1};
    case DataType::kUInt16:
    case DataType::kInt16: return {ncclUint8, 2};
    default: break;
  }
  throwError(StatusCode::kInternal,
             std::string("NCCL has no wire type for ") + dataTypeName(dtype));
}

ncclRedOp_t ncclReduceOp(ReduceOp op, DataType dtype) {
  bool logical = dtype == DataType::kBool;
  switch (op) {
    case ReduceOp::kSum: return logical ? ncclMax : ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProduct: return logical ? ncclMin : ncclProd;
    case ReduceOp::kAverage: break;
  }
  throwError(StatusCode::kInvalidArgument,
             std::string("NCCL backend got reduce op ") + reduceOpName(op) + " for " +
                 dataTypeName(dtype) +
                 ": expected sum, min, max or product (the core turns average into sum + scale)");
}

NcclScalingPlan ncclScalingPlan(DataType dtype, ReduceOp op, const ReduceScaling& scaling,
                                int members, int nccl_version) {
  NcclScalingPlan plan;
  if (scaling.trivial() || dtype == DataType::kBool) return plan;
  auto refuse = [&](std::string why) {
    plan.kind = NcclScalingPlan::kUnsupported;
    plan.why = std::move(why);
    return plan;
  };
  if (op != ReduceOp::kSum)
    return refuse(std::string("scale factors with ") + reduceOpName(op) +
                  " on CUDA tensors (only sum and average can be scaled on the device)");
  const bool floating = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
                        dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
  const bool unscaled = scaling.prescale == 1.0 && scaling.postscale == 1.0;
#if NCCL_VERSION_CODE >= 21000
  if (unscaled && scaling.divisor == members && nccl_version >= kNcclAvgVersion) {
    plan.kind = NcclScalingPlan::kAverage;
    return plan;
  }
#else
  (void)unscaled;
#endif
  plan.factor = scaling.prescale * scaling.postscale / static_cast<double>(scaling.divisor);
  if (!floating) {
    const bool is_unsigned = dtype == DataType::kUInt8;
    if (scaling.divisor != 1 || plan.factor != std::trunc(plan.factor) ||
        (is_unsigned && plan.factor < 0))
      return refuse(std::string("scale factors on ") + dataTypeName(dtype) +
                    " CUDA tensors must multiply to an integer" +
                    (is_unsigned ? " >= 0" : "") + ", without an average");
  }
#if NCCL_VERSION_CODE >= 21100
  if (nccl_version >= kNcclPreMulSumVersion) {
    plan.kind = NcclScalingPlan::kPreMulSum;
    return plan;
  }
#endif
  return refuse("scaling CUDA tensors needs NCCL " + ncclVersionString(kNcclPreMulSumVersion) +
                " (this is " + ncclVersionString(nccl_version) + ")");
}

std::string ncclVersionString(int version_code) {
  int major = version_code / 10000;
  int minor = (version_code % 10000) / 100;
  int patch = version_code % 100;
  if (version_code < 10000) {  // NCCL < 2.9 encoded major*1000 + minor*100 + patch
    major = version_code / 1000;
    minor = (version_code % 1000) / 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace detail
}  // namespace tutti
