// Counters of one rank since init: ops and bytes by op and backend, fused batches, cache
// hits and misses, rounds, and the time spent negotiating, packing, in the backend and
// unpacking. Whoever runs the round (one thread at a time) adds; any thread reads a
// snapshot. Thread-safe: the scalar counters are relaxed atomics (one writer at a time), the
// per-op table is under a mutex.
//
// Counters are name/value pairs (docs/c_api.md lists them), so that new ones never change
// a struct the C API has handed out.
#pragma once

#include "base/common.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tutti {

enum class StatTime : int { kNegotiation = 0, kPack, kBackend, kUnpack };

class Stats {
 public:
  // One backend call that ran `tensors` tensors of `bytes` in all.
  void addOp(OpType op, const char* backend, int64_t tensors, int64_t bytes);
  // One fused batch (an allreduce of more than one tensor).
  void addFusedBatch(int64_t tensors, int64_t bytes);
  void addCache(int64_t hits, int64_t misses);
  void addOrdered(int64_t agreed);  // ordered ops agreed by position (no gather)
  // One round; `by_caller`: run by a caller waiting on its op (Runtime::helpRounds).
  void addRound(bool had_work, bool by_caller);
  void addError();
  void addTime(StatTime what, Clock::duration d);

  // Every counter, sorted by name; counters that are still 0 included, per-op ones only
  // once an op of that kind ran.
  std::vector<std::pair<std::string, int64_t>> snapshot() const;
  // Bytes of every op so far (the op.*.bytes counters summed).
  int64_t totalBytes() const;
  // The snapshot as lines "name value" for TUTTI_STATS=1.
  std::string report() const;

 private:
  enum Scalar {
    kRounds,
    kRoundsWithWork,
    kRoundsByCaller,
    kCacheHits,
    kCacheMisses,
    kOrderedAgreed,
    kFusedBatches,
    kFusedTensors,
    kFusedBytes,
    kFusedMaxBytes,
    kErrors,
    kNegotiationNs,
    kPackNs,
    kBackendNs,
    kUnpackNs,
    kNumScalars
  };
  struct PerOp {
    OpType op;
    const char* backend;  // a backend's name(): a string literal of the backend
    int64_t calls = 0, tensors = 0, bytes = 0;
  };
  void add(Scalar which, int64_t n) { scalars_[which].fetch_add(n, std::memory_order_relaxed); }

  std::array<std::atomic<int64_t>, kNumScalars> scalars_{};
  mutable std::mutex mu_;
  std::vector<PerOp> per_op_;  // under mu_
};

}  // namespace tutti
