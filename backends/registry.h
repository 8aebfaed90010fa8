// Which backends this build has, and the one place that creates them.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>
#include <string>
#include <vector>

namespace tutti {

bool backendBuiltByName(const std::string& name);  // "mpi", "gloo", "nccl", "loopback"
std::vector<std::string> builtBackends();

// The CPU transport that `options` asks for (TUTTI_CPU_OPERATIONS), or, when it is empty,
// the one the launcher implies: mpi under mpirun, gloo under tuttirun --gloo, loopback for a
// single process. Throws Error(kUnsupported) for a backend this build lacks.
std::unique_ptr<Transport> makeTransport(const BackendOptions& options);

// Wraps `inner` (mpi or gloo; loopback in tests): its control planes are replaced by shm
// ones (backends/shm) for sets whose members share this host, and by two-level ones
// (backends/hierarchical) for sets across hosts with several members on some host, both
// decided collectively at set creation; everything else, the data-plane backends included,
// is inner's. Every rank must wrap its transport (TUTTI_SHM=0 too: its set creations then
// decline for every member). makeTransport wraps mpi and gloo with it.
std::unique_ptr<Transport> withShmControlPlanes(std::unique_ptr<Transport> inner,
                                                const BackendOptions& options);

// The ordered data-plane backends for one group: the GPU backend first (when built and a
// GPU is present), then shm (every member on this host) or hierarchical allreduce (hosts
// with as many members each, backends/hierarchical), then the transport's CPU backend. The
// first whose supports() accepts an op runs it.
std::vector<std::unique_ptr<Backend>> makeBackends(Transport& transport, ControlPlane& control,
                                                   const std::vector<int>& ranks, int id,
                                                   const BackendOptions& options);

// Sets `which` in a set's backends (BackendSwitch::kHierarchicalAllreduce: hierarchical
// allreduce on or off; TUTTI_HIERARCHICAL_ALLREDUCE gave its starting state), from the next
// call on. Returns false when no backend of the set has that switch (for hierarchical
// allreduce: one host, one member per host, uneven hosts, shm off). Only the execution
// stream calls it, as its SetBackendSwitch command, so that every member of the set flips
// it between the same two plans; or the thread that makes the set, before its first plan.
bool setBackendSwitch(const std::vector<std::unique_ptr<Backend>>& backends,
                      BackendSwitch which, bool on);
// 1 when the set's switch is on, 0 when off, -1 when it has none. Read by the thread that
// makes the set, or by the stream.
int backendSwitch(const std::vector<std::unique_ptr<Backend>>& backends, BackendSwitch which);

}  // namespace tutti
