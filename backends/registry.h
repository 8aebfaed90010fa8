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

// The ordered data-plane backends for one group: the GPU backend first (when built and a
// GPU is present), then shm (every member on this host) or hierarchical allreduce (hosts
// with as many members each, backends/hierarchical), then the transport's CPU backend. The
// first whose supports() accepts an op runs it.
std::vector<std::unique_ptr<Backend>> makeBackends(Transport& transport, ControlPlane& control,
                                                   const std::vector<int>& ranks, int id,
                                                   const BackendOptions& options);

// Switches hierarchical allreduce on or off in a set's backends, from the next allreduce
// on; TUTTI_HIERARCHICAL_ALLREDUCE gave the starting state. Returns false when the
// set has no hierarchical backend (one host, one member per host, uneven hosts, shm off).
// Call it on every member of the set between the same two rounds (e.g. right after a
// round's AND), from the background thread.
bool setHierarchicalAllreduce(const std::vector<std::unique_ptr<Backend>>& backends, bool on);
// 1 when the set's hierarchical allreduce is on, 0 when off, -1 when it has none.
int hierarchicalAllreduce(const std::vector<std::unique_ptr<Backend>>& backends);

}  // namespace tutti
