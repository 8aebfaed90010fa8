// One process set: its members, its negotiation channel, its backends, this rank's queue
// for it and (on its rank 0) its coordinator. Owned by the Runtime; the queue is
// thread-safe, everything else is used by the background thread only.
#pragma once

#include "backends/backend.h"
#include "core/coordinator.h"
#include "core/response_cache.h"
#include "core/tensor_queue.h"

#include <memory>
#include <vector>

namespace tutti {

struct CacheHit {
  int slot;
  Request request;
  Clock::time_point since;
};

struct ProcessSet {
  ProcessSet(int set_id, std::vector<int> set_ranks, int world_rank, int64_t cache_capacity)
      : id(set_id),
        ranks(std::move(set_ranks)),
        coordinator(static_cast<int>(ranks.size())),
        cache(cache_capacity) {
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == world_rank) rank = static_cast<int>(i);
  }
  int size() const { return static_cast<int>(ranks.size()); }
  bool member() const { return rank >= 0; }

  int id;
  std::vector<int> ranks;  // world ranks, sorted
  int rank = -1;           // this process's index in the set; -1 when not a member
  std::unique_ptr<ControlPlane> control;
  std::vector<std::unique_ptr<Backend>> backends;  // registry order: first that supports()
  TensorQueue queue;
  Coordinator coordinator;
  ResponseCache cache;
  bool joined = false;            // this rank's join is in flight
  // Cache hits waiting for the other members (slot, request), and requests to negotiate in
  // full next round (their slot was invalidated or evicted while they waited).
  std::vector<CacheHit> hits;
  std::vector<Request> demoted;
};

}  // namespace tutti
