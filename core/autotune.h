// Autotune (TUTTI_AUTOTUNE=1): while the job runs, rank 0 tries fusion thresholds, cycle
// times, the response cache on and off, and hierarchical allreduce on and off (where the job
// has it), a few measured windows each, and keeps what moved the most bytes per second;
// every rank applies rank 0's choice at the same round (runtime_round.cc).
//
// The search (pure, deterministic, unit-tested):
//   1. Warm-up: the first `warmup` windows under the starting settings are not scored.
//   2. Fusion threshold: each candidate (the starting value, then 1, 4, 16, 64 and 128 MiB)
//      runs 1 + `samples` windows; the first after a change is discarded (the change lands
//      mid-window), the score is the median of the rest. The best is kept.
//   3. Cycle time, with that threshold: the starting value, then 0.5, 1, 2 and 5 ms, alike.
//   4. Response cache, with those: the starting value, then the other one (skipped when the
//      cache has no slots).
//   5. Hierarchical allreduce, with those: likewise (skipped when the job has none: -1).
//   6. Done: the best settings stay.
// Horovod tunes the same knobs with Bayesian optimization over a continuous box; on these
// nearly separable knobs a coordinate search over a logarithmic grid needs few windows
// (with samples = 1: 21 for the two grids, 4 per switch) and never lands between grid points.
// Not thread-safe (the background thread of rank 0 only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {

struct TuneSettings {
  int64_t fusion_threshold;
  double cycle_time_ms;
  bool cache = true;      // response cache in use
  int hierarchical = -1;  // hierarchical allreduce: 0 off, 1 on, -1 the job has none
};

class Autotuner {
 public:
  // tune_cache: whether the cache is a knob (false when it has no slots).
  Autotuner(TuneSettings start, int warmup, int samples, bool tune_cache = true);

  // One window's measurement under current(): bytes moved by collectives and its length.
  // Returns the settings for the next window (and writes one line to log() when scored).
  TuneSettings observe(double bytes, double seconds);
  TuneSettings current() const { return current_; }
  bool done() const { return stage_ == kDone; }
  // "window,stage,fusion_threshold,cycle_time_ms,cache,hierarchical,bytes_per_second,scored"
  // lines so far, one per window, and a last "done" line with the choice and its score.
  const std::vector<std::string>& log() const { return log_; }

 private:
  enum Stage { kWarmup, kFusion, kCycle, kCache, kHierarchical, kDone };
  void startCandidate();
  void finishCandidate();
  size_t candidates() const;
  void nextStage();
  std::string line(const char* stage, const TuneSettings& s, double score, int scored) const;

  TuneSettings current_, best_;
  double best_score_ = -1;
  Stage stage_ = kWarmup;
  int warmup_left_, samples_;
  size_t candidate_ = 0;
  std::vector<int64_t> fusion_candidates_;
  std::vector<double> cycle_candidates_;
  std::vector<Stage> stages_;  // the knobs' stages, in order
  size_t stage_index_ = 0;
  std::vector<double> scores_;  // of the current candidate
  bool discard_next_ = false;
  int64_t window_ = 0;
  std::vector<std::string> log_;
};

}  // namespace tutti
