// Open MPI transport: control plane and data plane on communicators derived from
// MPI_COMM_WORLD. Initializes MPI with MPI_THREAD_MULTIPLE unless the program already did
// (then it leaves MPI to the program). MPI that Tutti initialized stays up after the
// transport is destroyed, so that a later transport (init after shutdown) works, and is
// finalized at process exit.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>

namespace tutti {

std::unique_ptr<Transport> makeMpiTransport(const BackendOptions& options);

}  // namespace tutti
