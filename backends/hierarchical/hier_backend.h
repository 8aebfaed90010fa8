// Hierarchical allreduce and allgather(v) for a process set that spans hosts with the same
// number (> 1) of members on each (docs/architecture.md, "Hierarchical collectives"). The
// registry puts it ahead of the transport's backend for such sets; it runs allreduce (while
// switched on) and allgather (when the set was made with it on), and hands every other call
// to that backend.
#pragma once

#include "backends/backend.h"
#include "backends/hierarchical/host_layout.h"
#include "backends/options.h"
#include "backends/shm/shm_segment.h"

#include <memory>
#include <string>
#include <vector>

namespace tutti {

// Collective over the members of `control` (world ranks `ranks`, process set `id`): a
// hierarchical backend when the set spans hosts evenly with more than one member on each,
// every member enables shm and every member could make its sub-groups; else nullptr on
// every member (the reason logged at debug level). It starts on or off as member 0's
// TUTTI_HIERARCHICAL_ALLREDUCE says (made under 0 too, so that its switch,
// BackendSwitch::kHierarchicalAllreduce, can turn it on later). `flat` is the transport's
// backend for the same set; it must outlive the result.
std::unique_ptr<Backend> makeHierarchicalBackend(Transport& transport, ControlPlane& control,
                                                 Backend& flat, const std::vector<int>& ranks,
                                                 int id, const BackendOptions& options);

// The same with an explicit layout and shm options (tests: threads as ranks with made-up
// hosts), allreduce starting on or off, allgather as layout.hierarchical_allgather says.
// Collective over `control` as above.
std::unique_ptr<Backend> makeHierarchicalBackend(Transport& transport, ControlPlane& control,
                                                 Backend& flat,
                                                 const detail::HostLayout& layout, bool on,
                                                 const detail::ShmOptions& shm);

}  // namespace tutti
