// In-process transport: ranks are threads sharing one LoopbackHub. Used by the unit tests
// (threads as ranks) and for a world of one. Real data movement through shared memory,
// with deadlines; a timeout or abort() poisons the group (both its control plane and its
// data plane) so every member fails fast with the same error. Groups with different ids
// are independent: several can run at once on different threads.
#pragma once

#include "backends/backend.h"

#include <memory>

namespace tutti {

class LoopbackHub;  // shared by the threads of one job

std::shared_ptr<LoopbackHub> makeLoopbackHub(int world_size);
std::unique_ptr<Transport> makeLoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank);

}  // namespace tutti
