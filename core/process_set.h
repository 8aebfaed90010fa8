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
#include <map>
#include <memory>
#include <mutex>
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

// The runtime's process sets by id. Thread-safe: API threads look sets up; the thread that
// makes the global set at init and then the background thread (a ChangeSets command) add
// and remove them.
class SetTable {
 public:
  std::shared_ptr<ProcessSet> find(int id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(id);
    return it == sets_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<ProcessSet>> all() const {  // in id order
    std::vector<std::shared_ptr<ProcessSet>> sets;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : sets_) sets.push_back(kv.second);
    return sets;
  }
  void put(std::shared_ptr<ProcessSet> set) {
    std::lock_guard<std::mutex> lock(mu_);
    sets_[set->id] = std::move(set);
  }
  std::shared_ptr<ProcessSet> remove(int id) {  // null when unknown
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) return nullptr;
    auto set = std::move(it->second);
    sets_.erase(it);
    return set;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    sets_.clear();
  }
  // This rank's entries in flight, over the sets it belongs to.
  int64_t inFlight() const {
    int64_t n = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : sets_)
      if (kv.second->member()) n += static_cast<int64_t>(kv.second->queue.inFlight());
    return n;
  }
  // The id of the next set: the lowest no set holds, so a removed set's id is given again
  // (as Horovod does). The same on every rank: sets change only in agreed order.
  int nextId() const {
    std::lock_guard<std::mutex> lock(mu_);
    int id = 1;
    for (const auto& kv : sets_) {
      if (kv.first == id) ++id;
      else if (kv.first > id) break;
    }
    return id;
  }

 private:
  mutable std::mutex mu_;
  std::map<int, std::shared_ptr<ProcessSet>> sets_;
};

}  // namespace tutti
