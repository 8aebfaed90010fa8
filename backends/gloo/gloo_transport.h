// gloo transport: TCP pairs set up through tuttirun's authenticated rendezvous server
// (TUTTI_RENDEZVOUS_ADDR/PORT, TUTTI_SECRET). Needs no MPI.
#pragma once

#include "backends/backend.h"
#include "backends/options.h"

#include <memory>

namespace tutti {

std::unique_ptr<Transport> makeGlooTransport(const BackendOptions& options);

}  // namespace tutti
