// How a worker of an elastic job finds its rank and size (the protocol is in
// backends/elastic.h). Used by the gloo transport at init.
#pragma once

#include "backends/gloo/rendezvous_client.h"
#include "backends/options.h"

#include <cstdint>
#include <string>

namespace tutti {
namespace detail {

struct ElasticSeat {
  int64_t generation = -1;
  int rank = 0, size = 1;
};

// Waits up to worker.timeout_seconds for the launcher to publish a generation this process
// has not run in yet (the newest one), and returns its seat there; records it as the
// generation this process joined. Throws Error(kTimeout) naming the worker and the generation
// it waited past; Error(kAborted) when the newest generation has no seat for it.
ElasticSeat joinElasticGeneration(RendezvousClient& store, const ElasticWorker& worker);

}  // namespace detail
}  // namespace tutti
