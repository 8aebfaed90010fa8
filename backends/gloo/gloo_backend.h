// The gloo data plane (Backend) and control plane (ControlPlane) over one connected
// GlooGroup each. Both are used only from the background thread; abort() from any thread.
#pragma once

#include "backends/backend.h"
#include "backends/gloo/gloo_group.h"

#include <memory>

namespace tutti {
namespace detail {

std::unique_ptr<Backend> makeGlooBackend(std::unique_ptr<GlooGroup> group);
std::unique_ptr<ControlPlane> makeGlooControlPlane(std::unique_ptr<GlooGroup> group);

}  // namespace detail
}  // namespace tutti
