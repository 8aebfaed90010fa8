#include "core/autotune.h"

#include <algorithm>
#include <cstdio>

namespace tutti {

Autotuner::Autotuner(TuneSettings start, int warmup, int samples)
    : current_(start), best_(start), warmup_left_(std::max(warmup, 0)),
      samples_(std::max(samples, 1)) {
  fusion_candidates_ = {start.fusion_threshold, 1ll << 20, 4ll << 20, 16ll << 20, 64ll << 20,
                        128ll << 20};
  cycle_candidates_ = {start.cycle_time_ms, 0.5, 1, 2, 5};
  if (warmup_left_ == 0) {
    stage_ = kFusion;
    startCandidate();
  }
}

void Autotuner::startCandidate() {
  if (stage_ == kFusion) current_.fusion_threshold = fusion_candidates_[candidate_];
  if (stage_ == kCycle) current_.cycle_time_ms = cycle_candidates_[candidate_];
  scores_.clear();
  discard_next_ = candidate_ > 0 || stage_ == kCycle;  // a change lands mid-window
}

void Autotuner::finishCandidate() {
  std::vector<double> s = scores_;
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  if (median > best_score_) {
    best_score_ = median;
    best_ = current_;
  }
  const size_t count = stage_ == kFusion ? fusion_candidates_.size() : cycle_candidates_.size();
  if (++candidate_ < count) {
    current_ = best_;
    startCandidate();
    return;
  }
  candidate_ = 0;
  current_ = best_;
  if (stage_ == kFusion) {
    stage_ = kCycle;
    startCandidate();
  } else {
    stage_ = kDone;
    char line[160];  // the choice: window number of the last window, its best score
    std::snprintf(line, sizeof line, "%lld,done,%lld,%g,%.0f,0", static_cast<long long>(window_),
                  static_cast<long long>(best_.fusion_threshold), best_.cycle_time_ms, best_score_);
    log_.push_back(line);
  }
}

TuneSettings Autotuner::observe(double bytes, double seconds) {
  ++window_;
  const double score = seconds > 0 ? bytes / seconds : 0;
  const Stage stage = stage_;            // what this window measured
  const TuneSettings measured = current_;
  static const char* const stages[] = {"warmup", "fusion", "cycle", "done"};
  bool scored = false;
  if (stage_ == kWarmup) {
    if (--warmup_left_ <= 0) {
      stage_ = kFusion;
      startCandidate();
      discard_next_ = false;  // the starting settings: nothing changed
    }
  } else if (stage_ != kDone) {
    if (discard_next_) {
      discard_next_ = false;
    } else {
      scored = true;
      scores_.push_back(score);
    }
  }
  char line[160];
  std::snprintf(line, sizeof line, "%lld,%s,%lld,%g,%.0f,%d", static_cast<long long>(window_),
                stages[stage], static_cast<long long>(measured.fusion_threshold),
                measured.cycle_time_ms, score, scored ? 1 : 0);
  log_.push_back(line);
  if (scored && static_cast<int>(scores_.size()) >= samples_) finishCandidate();
  return current_;
}

}  // namespace tutti
