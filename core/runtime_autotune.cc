// Autotune's place in the round (core/autotune.h has the search).
#include "backends/registry.h"
#include "base/logging.h"
#include "core/runtime.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace tutti {
namespace {

std::string describe(const TuneSettings& s) {
  std::ostringstream text;
  text << "fusion threshold " << s.fusion_threshold << " bytes, cycle time " << s.cycle_time_ms
       << " ms, cache " << (s.cache ? "on" : "off");
  if (s.hierarchical >= 0) text << ", hierarchical allreduce " << (s.hierarchical ? "on" : "off");
  return text.str();
}

}  // namespace

void Runtime::tune(ProcessSet& global) {
  // 1. Rank 0: once a window has passed, score it and take the next settings.
  // 2. Rank 0 broadcasts the settings in force; every rank applies them before it plans
  //    this round's fusion.
  std::string message;
  if (global.rank == 0) {
    const auto now = Clock::now();
    if (!autotuner_) {
      autotuner_ = std::make_unique<Autotuner>(tuned_, config_.autotune_warmup_windows,
                                               config_.autotune_samples,
                                               config_.cache_capacity > 0);
      tune_window_start_ = now;
      tune_window_bytes_ = stats_.totalBytes();
      if (!config_.autotune_log.empty())
        if (FILE* f = std::fopen(config_.autotune_log.c_str(), "w")) {
          std::fputs("window,stage,fusion_threshold,cycle_time_ms,cache,hierarchical,"
                     "bytes_per_second,scored\n", f);
          std::fclose(f);
        }
    }
    const double seconds = std::chrono::duration<double>(now - tune_window_start_).count();
    if (!autotuner_->done() && seconds >= config_.autotune_window_seconds) {
      const int64_t bytes = stats_.totalBytes();
      const size_t logged = autotuner_->log().size();
      const TuneSettings s = autotuner_->observe(static_cast<double>(bytes - tune_window_bytes_), seconds);
      if (autotuner_->done())
        TUTTI_LOG(kInfo) << "autotune: done after " << logged + 1
                         << " windows: " << describe(s);
      tune_window_start_ = now;
      tune_window_bytes_ = bytes;
      if (!config_.autotune_log.empty())
        if (FILE* f = std::fopen(config_.autotune_log.c_str(), "a")) {
          for (size_t i = logged; i < autotuner_->log().size(); ++i)
            std::fprintf(f, "%s\n", autotuner_->log()[i].c_str());
          std::fclose(f);
        }
    }
    const TuneSettings next = autotuner_->current();
    message = std::to_string(next.fusion_threshold) + " " + std::to_string(next.cycle_time_ms) +
              " " + std::to_string(next.cache ? 1 : 0) + " " + std::to_string(next.hierarchical);
  }
  const std::string sent = global.control->broadcast(message, deadlineAfter(config_.timeout_seconds));
  std::istringstream in(sent);
  TuneSettings next = tuned_;
  int cache = 1;
  in >> next.fusion_threshold >> next.cycle_time_ms >> cache >> next.hierarchical;
  if (in.fail() || next.fusion_threshold < 0 || !std::isfinite(next.cycle_time_ms) ||
      next.cycle_time_ms < 0 || (cache != 0 && cache != 1) || next.hierarchical < -1 ||
      next.hierarchical > 1)
    throwError(StatusCode::kInternal,
               "autotune: rank " + std::to_string(config_.topology.rank) +
                   " got settings '" + sent.substr(0, 100) + "' from rank 0; expected "
                   "'<fusion threshold >= 0> <cycle time ms >= 0> <cache 0|1> <hierarchical -1|0|1>'");
  next.cache = cache != 0;
  if (describe(next) != describe(tuned_))
    TUTTI_LOG(kDebug) << "autotune: " << describe(next) << " from round " << rounds_;
  // Hierarchical allreduce switches after every plan of the rounds before and before this
  // round's: a command on the stream, enqueued at the same point on every rank.
  if (next.hierarchical >= 0 && next.hierarchical != tuned_.hierarchical) {
    SetBackendSwitch flip;
    flip.which = BackendSwitch::kHierarchicalAllreduce;
    flip.on = next.hierarchical == 1;
    for (auto& set : sets_.all())
      if (set->member()) flip.sets.push_back(std::move(set));
    stream_.enqueue(std::move(flip));
  }
  tuned_ = next;  // the cache follows at the start of the next round (Negotiator::useCache)
}

}  // namespace tutti
