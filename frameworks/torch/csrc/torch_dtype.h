// The one mapping from torch's scalar types to Tutti's (tutti/tutti.h), shared by the
// tutti.torch ops (torch_ops.cc) and the torch.distributed backend (c10d_backend.cc).
#pragma once

#include <torch/extension.h>
#include <torch/version.h>

#include <tutti/tutti.h>

namespace tutti {
namespace torch_ext {

// What a refusal lists as supported.
constexpr const char* kSupportedDtypes =
    "uint8, int8, int16, uint16 (PyTorch 2.3 and later), int32, int64, float16, bfloat16, "
    "float32, float64 or bool";

// Tutti's dtype for `type`; false when Tutti has none (the caller words the refusal).
inline bool toTuttiDtype(at::ScalarType type, tutti_dtype_t* dtype) {
  switch (type) {
    case at::kByte: *dtype = TUTTI_UINT8; return true;
    case at::kChar: *dtype = TUTTI_INT8; return true;
    case at::kShort: *dtype = TUTTI_INT16; return true;
    case at::kInt: *dtype = TUTTI_INT32; return true;
    case at::kLong: *dtype = TUTTI_INT64; return true;
    case at::kHalf: *dtype = TUTTI_FLOAT16; return true;
    case at::kBFloat16: *dtype = TUTTI_BFLOAT16; return true;
    case at::kFloat: *dtype = TUTTI_FLOAT32; return true;
    case at::kDouble: *dtype = TUTTI_FLOAT64; return true;
    case at::kBool: *dtype = TUTTI_BOOL; return true;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case at::kUInt16: *dtype = TUTTI_UINT16; return true;  // torch.uint16 exists from 2.3
#endif
    default: return false;
  }
}

}  // namespace torch_ext
}  // namespace tutti
