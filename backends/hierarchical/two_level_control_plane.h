// Negotiation for a process set that spans hosts with more than one member on some host:
// the AND of the bit vector (every round's agreement) in two levels, gather and broadcast
// (rare: cache misses) over the set's own control plane. Internal to backends/.
#pragma once

#include "backends/backend.h"
#include "backends/hierarchical/host_layout.h"

#include <memory>

namespace tutti {

// Collective over the members of `set` (its layout `layout`, from exchangeLayout()): when
// the set spans hosts with more than one member on some host and every member enables
// shm, returns the two-level control plane, made of `set`, a control plane of this host's
// members from `local_transport` (shared memory when it is the shm-wrapped transport) and
// one of the first member of each host from `cross_transport`. Otherwise returns `set`.
std::unique_ptr<ControlPlane> makeTwoLevelControlPlane(Transport& local_transport,
                                                       Transport& cross_transport,
                                                       std::unique_ptr<ControlPlane> set,
                                                       const detail::HostLayout& layout);

}  // namespace tutti
