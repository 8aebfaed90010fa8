// In-process transport: ranks are threads sharing one LoopbackHub. Used by the unit tests
// (threads as ranks) and for a world of one. Real data movement through shared memory,
// with deadlines; a timeout poisons the hub so every thread fails fast.
#pragma once

#include "backends/backend.h"

#include <memory>

namespace tutti {

class LoopbackHub;  // shared by the threads of one job

std::shared_ptr<LoopbackHub> makeLoopbackHub(int world_size);
std::unique_ptr<Transport> makeLoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank);

}  // namespace tutti
