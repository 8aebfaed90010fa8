// NCCL data plane for CUDA tensors. Bootstraps its communicator through the group's
// ControlPlane. Returns null when no CUDA device is visible.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>

namespace tutti {

std::unique_ptr<Backend> makeNcclBackend(ControlPlane& control, const BackendOptions& options);

}  // namespace tutti
