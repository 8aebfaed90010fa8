// The shared-memory data plane for a process set whose members all run on this host
// (docs/architecture.md, "The shm backend"). The registry puts it ahead of the transport's
// CPU backend; it declines (nullptr) for sets that span hosts or when TUTTI_SHM=0.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"
#include "backends/shm/shm_segment.h"

#include <memory>
#include <string>
#include <vector>

namespace tutti {

// Collective over the members of `control` (world ranks `ranks`, process set `id`): a shm
// backend when every member runs on this host and enables shm, else nullptr on every
// member (the reason is logged at debug level). `transport` is the transport's name: over
// "mpi" the backend leaves alltoall to MPI, and hands broadcasts of 256 KiB to 8 MiB to
// `next`, the transport's backend of the same set (measured faster there); `next` must
// outlive the result.
std::unique_ptr<Backend> makeShmBackend(ControlPlane& control, const std::vector<int>& ranks,
                                        int id, const BackendOptions& options,
                                        const std::string& transport, Backend& next);
// The same with explicit options (tests: small buffers force many chunks).
std::unique_ptr<Backend> makeShmBackend(ControlPlane& control, const std::vector<int>& ranks,
                                        int id, const detail::ShmOptions& options);

}  // namespace tutti
