// Negotiation over shared memory: for a process set whose members all run on this host,
// gather, broadcast and the AND of the bit vector go through a ShmSegment of their own
// (one round each in the steady state) instead of the transport's TCP or MPI messages.
// Internal to backends/ (the registry composes it with the two-level control plane).
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>
#include <vector>

namespace tutti {

// Collective over the members of `ranks` (a process set `id`) through `set`, their control
// plane from the transport: when every member runs on this host and enables shm
// (options.shm), returns the shm control plane, which takes `set` (kept only to abort it
// too). Otherwise returns nullptr, the same on every member, and `set` stays the caller's.
// Every member must call it (TUTTI_SHM=0 too: it then says no for all of them).
std::unique_ptr<ControlPlane> makeShmControlPlane(std::unique_ptr<ControlPlane>& set,
                                                  const std::vector<int>& ranks, int id,
                                                  const BackendOptions& options);

}  // namespace tutti
