// gloo transport: TCP pairs set up through tuttirun's authenticated rendezvous server
// (TUTTI_RENDEZVOUS_ADDR/PORT, TUTTI_SECRET). Needs no MPI.
#pragma once

#include "backends/backend.h"
#include "core/config.h"

#include <memory>

namespace tutti {

std::unique_ptr<Transport> makeGlooTransport(const Config& config);

}  // namespace tutti
