// Autotune (TUTTI_AUTOTUNE=1): while the job runs, rank 0 tries fusion thresholds and
// cycle times, one measured window each, and keeps the one that moved the most bytes per
// second; every rank applies rank 0's choice at the same round (runtime_round.cc).
//
// The search (pure, deterministic, unit-tested):
//   1. Warm-up: the first `warmup` windows under the starting settings are not scored.
//   2. Fusion threshold: each candidate (the starting value, then 1, 4, 16, 64 and 128 MiB)
//      runs 1 + `samples` windows; the first after a change is discarded (the change lands
//      mid-window), the score is the median of the rest. The best is kept.
//   3. Cycle time, with that threshold: the starting value, then 0.5, 1, 2 and 5 ms, alike.
//   4. Done: the best pair stays.
// Horovod tunes the same two (and more) with Bayesian optimization over a continuous box;
// on these two nearly separable knobs a coordinate search over a logarithmic grid needs
// fewer windows (22 at most with samples = 3) and never lands between grid points.
// Not thread-safe (the background thread of rank 0 only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {

struct TuneSettings {
  int64_t fusion_threshold;
  double cycle_time_ms;
};

class Autotuner {
 public:
  Autotuner(TuneSettings start, int warmup, int samples);

  // One window's measurement under current(): bytes moved by collectives and its length.
  // Returns the settings for the next window (and writes one line to log() when scored).
  TuneSettings observe(double bytes, double seconds);
  TuneSettings current() const { return current_; }
  bool done() const { return stage_ == kDone; }
  // "window,stage,fusion_threshold,cycle_time_ms,bytes_per_second,scored" lines so far, one
  // per window, and a last "done" line with the choice and its score.
  const std::vector<std::string>& log() const { return log_; }

 private:
  enum Stage { kWarmup, kFusion, kCycle, kDone };
  void startCandidate();
  void finishCandidate();

  TuneSettings current_, best_;
  double best_score_ = -1;
  Stage stage_ = kWarmup;
  int warmup_left_, samples_;
  size_t candidate_ = 0;
  std::vector<int64_t> fusion_candidates_;
  std::vector<double> cycle_candidates_;
  std::vector<double> scores_;  // of the current candidate
  bool discard_next_ = false;
  int64_t window_ = 0;
  std::vector<std::string> log_;
};

}  // namespace tutti
