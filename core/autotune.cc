#include "core/autotune.h"

#include <algorithm>
#include <cstdio>

namespace tutti {

Autotuner::Autotuner(TuneSettings start, int warmup, int samples, bool tune_cache)
    : current_(start), best_(start), warmup_left_(std::max(warmup, 0)),
      samples_(std::max(samples, 1)) {
  fusion_candidates_ = {start.fusion_threshold, 1ll << 20, 4ll << 20, 16ll << 20, 64ll << 20,
                        128ll << 20};
  cycle_candidates_ = {start.cycle_time_ms, 0.5, 1, 2, 5};
  stages_ = {kFusion, kCycle};
  if (tune_cache) stages_.push_back(kCache);
  if (start.hierarchical >= 0) stages_.push_back(kHierarchical);
  stages_.push_back(kDone);
  if (warmup_left_ == 0) {
    stage_ = stages_[0];
    startCandidate();
  }
}

size_t Autotuner::candidates() const {
  switch (stage_) {
    case kFusion: return fusion_candidates_.size();
    case kCycle: return cycle_candidates_.size();
    default: return 2;  // the starting value and the other one
  }
}

void Autotuner::startCandidate() {
  // Candidate 0 of every stage is the best so far: only candidates > 0 change a knob.
  if (stage_ == kFusion) current_.fusion_threshold = fusion_candidates_[candidate_];
  if (stage_ == kCycle) current_.cycle_time_ms = cycle_candidates_[candidate_];
  if (stage_ == kCache && candidate_ > 0) current_.cache = !best_.cache;
  if (stage_ == kHierarchical && candidate_ > 0) current_.hierarchical = 1 - best_.hierarchical;
  scores_.clear();
  discard_next_ = candidate_ > 0 || stage_ != kFusion;  // a change lands mid-window
}

void Autotuner::nextStage() {
  candidate_ = 0;
  current_ = best_;
  stage_ = stages_[++stage_index_];
  if (stage_ != kDone) return startCandidate();
  log_.push_back(line("done", best_, best_score_, 0));  // the choice and its best score
}

void Autotuner::finishCandidate() {
  std::vector<double> s = scores_;
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  if (median > best_score_) {
    best_score_ = median;
    best_ = current_;
  }
  if (++candidate_ >= candidates()) return nextStage();
  current_ = best_;
  startCandidate();
}

std::string Autotuner::line(const char* stage, const TuneSettings& s, double score,
                            int scored) const {
  char text[192];
  std::snprintf(text, sizeof text, "%lld,%s,%lld,%g,%d,%d,%.0f,%d",
                static_cast<long long>(window_), stage,
                static_cast<long long>(s.fusion_threshold), s.cycle_time_ms, s.cache ? 1 : 0,
                s.hierarchical, score, scored);
  return text;
}

TuneSettings Autotuner::observe(double bytes, double seconds) {
  ++window_;
  const double score = seconds > 0 ? bytes / seconds : 0;
  const Stage stage = stage_;            // what this window measured
  const TuneSettings measured = current_;
  static const char* const names[] = {"warmup", "fusion", "cycle", "cache", "hierarchical",
                                      "done"};
  bool scored = false;
  if (stage_ == kWarmup) {
    if (--warmup_left_ <= 0) {
      stage_ = stages_[0];
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
  log_.push_back(line(names[stage], measured, score, scored ? 1 : 0));
  if (scored && static_cast<int>(scores_.size()) >= samples_) finishCandidate();
  return current_;
}

}  // namespace tutti
