// Negotiation over shared memory: for a process set whose members all run on this host,
// gather, broadcast and the AND of the bit vector go through a ShmSegment of their own
// (one round each in the steady state) instead of the transport's TCP or MPI messages.
// Internal to backends/shm and the registry.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>

namespace tutti {

// Wraps `inner` (mpi or gloo): its control planes are replaced by shm ones for sets whose
// members share this host (decided collectively at set creation, like the shm backend),
// and by two-level ones for sets across hosts with several members on some host;
// everything else, the data-plane backends included, is inner's. Every rank must wrap its
// transport (TUTTI_SHM=0 too: its set creations then decline for every member).
std::unique_ptr<Transport> withShmControlPlanes(std::unique_ptr<Transport> inner,
                                                const BackendOptions& options);

}  // namespace tutti
