#include "core/stats.h"

#include <algorithm>
#include <cstring>

namespace tutti {

void Stats::addOp(OpType op, const char* backend, int64_t tensors, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(per_op_.begin(), per_op_.end(), [&](const PerOp& p) {
    return p.op == op && (p.backend == backend || std::strcmp(p.backend, backend) == 0);
  });
  if (it == per_op_.end()) it = per_op_.insert(per_op_.end(), PerOp{op, backend});
  it->calls += 1;
  it->tensors += tensors;
  it->bytes += bytes;
}

void Stats::addFusedBatch(int64_t tensors, int64_t bytes) {
  add(kFusedBatches, 1);
  add(kFusedTensors, tensors);
  add(kFusedBytes, bytes);
  if (bytes > scalars_[kFusedMaxBytes].load(std::memory_order_relaxed))  // one writer
    scalars_[kFusedMaxBytes].store(bytes, std::memory_order_relaxed);
}

void Stats::addCache(int64_t hits, int64_t misses) {
  add(kCacheHits, hits);
  add(kCacheMisses, misses);
}

void Stats::addOrdered(int64_t agreed) { add(kOrderedAgreed, agreed); }

void Stats::addRound(bool had_work, bool by_caller) {
  add(kRounds, 1);
  if (had_work) add(kRoundsWithWork, 1);
  if (by_caller) add(kRoundsByCaller, 1);
}

void Stats::addError() { add(kErrors, 1); }

void Stats::addTime(StatTime what, Clock::duration d) {
  add(static_cast<Scalar>(kNegotiationNs + static_cast<int>(what)),
      std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

std::vector<std::pair<std::string, int64_t>> Stats::snapshot() const {
  static const char* const names[kNumScalars] = {
      "rounds",          "rounds.with_work", "rounds.by_caller", "cache.hits", "cache.misses",
      "ordered.agreed",
      "fusion.batches",  "fusion.tensors",   "fusion.bytes",    "fusion.max_bytes",
      "errors",          "time.negotiation_ns", "time.pack_ns", "time.backend_ns",
      "time.unpack_ns"};
  std::vector<std::pair<std::string, int64_t>> out;
  for (int i = 0; i < kNumScalars; ++i)
    out.emplace_back(names[i], scalars_[i].load(std::memory_order_relaxed));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : per_op_) {
    const std::string prefix = std::string("op.") + opTypeName(p.op) + "." + p.backend + ".";
    out.emplace_back(prefix + "calls", p.calls);
    out.emplace_back(prefix + "tensors", p.tensors);
    out.emplace_back(prefix + "bytes", p.bytes);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t Stats::totalBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& p : per_op_) total += p.bytes;
  return total;
}

std::string Stats::report() const {
  std::string out;
  for (const auto& kv : snapshot()) out += "  " + kv.first + " " + std::to_string(kv.second) + "\n";
  return out;
}

}  // namespace tutti
