// One process set: its members, its negotiation channel, its backends, this rank's queue
// for it and its negotiator (cache, coordinator, the state between rounds). Owned by the
// Runtime. Threads: the queue is thread-safe; the control plane and the negotiator are the
// background thread's; the backends are the execution stream's (core/exec_stream.h: made by
// the thread that makes the set before its first plan, then called only by the stream's
// commands, abort() from any thread). The members never change.
#pragma once

#include "backends/backend.h"
#include "core/negotiator.h"
#include "core/tensor_queue.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace tutti {

struct ProcessSet {
  ProcessSet(int set_id, std::vector<int> set_ranks, int world_rank, int64_t cache_capacity)
      : id(set_id),
        ranks(std::move(set_ranks)),
        rank(indexOf(ranks, world_rank)),
        negotiator(set_id, rank, size(), cache_capacity) {}
  int size() const { return static_cast<int>(ranks.size()); }
  bool member() const { return rank >= 0; }

  int id;
  std::vector<int> ranks;  // world ranks, sorted
  int rank = -1;           // this process's index in the set; -1 when not a member
  std::unique_ptr<ControlPlane> control;
  std::vector<std::unique_ptr<Backend>> backends;  // registry order: first that supports()
  TensorQueue queue;
  Negotiator negotiator;

 private:
  static int indexOf(const std::vector<int>& ranks, int world_rank) {
    auto it = std::find(ranks.begin(), ranks.end(), world_rank);
    return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  }
};

}  // namespace tutti
