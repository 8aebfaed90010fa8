// The background thread's round (see runtime.h, steps 2-5): each set's negotiator builds
// its bits, one AND-allreduce for all, then set by set: agree, plan fusion, enqueue the plan
// on the execution stream; and rank 0's stall checks.
#include "base/logging.h"
#include "core/runtime.h"

#include <algorithm>
#include <limits>

namespace tutti {
namespace {

// What a round did, for the timeline's rounds row.
struct RoundNotes {
  int64_t cache_hits = 0, ordered = 0, negotiated = 0, batches = 0, bytes = 0;
};

int64_t rowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i)
    if (!checkedMul(n, shape[i], &n)) return INT64_MAX;
  return n;
}

}  // namespace

bool Runtime::runRound(bool* had_work) {
  const std::vector<std::shared_ptr<ProcessSet>> sets = sets_.all();
  const std::shared_ptr<Timeline> tl = timeline();
  const int64_t round_start = tl ? tl->now() : 0;
  if (tl && tl->markCycles()) tl->cycleMark();
  ++rounds_;
  RoundNotes notes;
  struct Flush {  // the timeline file gets this round's events however the round ends
    Timeline* tl;
    ~Flush() {
      if (tl) tl->flush();
    }
  } flush{tl.get()};
  bool shutting_down;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    shutting_down = shutdown_requested_;
  }
  // 1. Each set's negotiator turns this rank's new requests into its bits (autotune's cache
  //    switch from the last round first, on every rank alike).
  RoundBits bits(sets.size(), config_.cache_capacity);
  if (shutting_down) bits.clearRunning();
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    set.negotiator.useCache(tuned_.cache);
    int64_t hits = 0, misses = 0;
    set.queue.popNew(&fresh_);  // read in place: the entries stay until agreed on
    set.negotiator.contribute(fresh_, set.rank == 0 ? checkStalls(set) : "", bits, i, tl.get(),
                              &hits, &misses);
    stats_.addCache(hits, misses);
  }
  // 2. One AND-allreduce over the global set.
  const auto and_start = Clock::now();
  sets[0]->control->allreduceAnd(bits.words(), deadlineAfter(config_.timeout_seconds));
  stats_.addTime(StatTime::kNegotiation, Clock::now() - and_start);
  const Status failed = stream_.failure();  // a command failed on the stream's thread
  if (!failed.ok()) throwError(failed.code(), failed.message());
  // Every rank runs the same rounds (the AND above is collective), so each one reaches
  // this point in the same round: rank 0's autotune choice applies everywhere at once (a
  // backend switch as a command on the stream, after every plan of the rounds before).
  if (config_.autotune && bits.running() && rounds_ % kTuneEveryRounds == 0) tune(*sets[0]);

  // 3-4. Set by set, in id order: agree, plan fusion, enqueue on the stream.
  *had_work = false;
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    Agreement agreed = set.negotiator.agree(bits, i, *set.control, set.queue,
                                            deadlineAfter(config_.timeout_seconds), tl.get(),
                                            tuned_.fusion_threshold);
    stats_.addTime(StatTime::kNegotiation, agreed.negotiation);
    if (!agreed.active) continue;
    *had_work = true;
    notes.cache_hits += static_cast<int64_t>(agreed.cached);
    notes.ordered += static_cast<int64_t>(agreed.ordered);
    stats_.addOrdered(static_cast<int64_t>(agreed.ordered));
    notes.negotiated += static_cast<int64_t>(agreed.negotiated);
    std::vector<Response> plan = std::move(agreed.responses);  // fused by agree()
    std::vector<int64_t> bytes(plan.size());
    for (size_t k = 0; k < plan.size(); ++k) {
      const Response& r = plan[k];
      // An error runs on the entries this rank holds now, never on one submitted while the
      // plan waits on the stream (whose request the next round may be reading).
      if (r.type == ResponseType::kError) set.queue.claim(r.names);
      int64_t row = 0;  // allgather, alltoall: elements per row (trailing dims agree)
      if (r.type == ResponseType::kOp && (r.op == OpType::kAllgather || r.op == OpType::kAlltoall))
        if (auto request = set.queue.peek(r.names[0])) row = rowElements(request->shape);
      bytes[k] = responseBytes(r, set.rank, set.size(), row);
      if (!checkedAdd(notes.bytes, bytes[k], &notes.bytes)) notes.bytes = INT64_MAX;
    }
    if (logEnabled(LogLevel::kDebug)) logRound(set, plan, bytes, agreed.cached);
    notes.batches += static_cast<int64_t>(plan.size());
    enqueuePlan(sets[i], std::move(plan), bytes, tl);
  }
  stats_.addRound(*had_work, round_helper_.load() == std::this_thread::get_id());
  if (tl && *had_work)
    tl->round(round_start, "\"round\":" + std::to_string(rounds_) +
                               ",\"cache_hits\":" + std::to_string(notes.cache_hits) +
                               ",\"ordered\":" + std::to_string(notes.ordered) +
                               ",\"negotiated\":" + std::to_string(notes.negotiated) +
                               ",\"batches\":" + std::to_string(notes.batches) +
                               ",\"bytes\":" + std::to_string(notes.bytes));
  for (auto& set : sets)  // demoted requests are negotiated at once
    if (set->member() && set->negotiator.hasDemoted()) *had_work = true;
  // 5. Shutdown: every rank learns it in the same round, then who stopped and why, once
  //    everything planned has run.
  if (!bits.running()) {
    stream_.drain();
    std::string note;
    if (shutting_down) {
      std::lock_guard<std::mutex> lock(wake_mu_);
      note = leave_note_;
    }
    std::string who = exchangeLeaveNotes(*sets[0], note);
    if (!shutting_down) job_failed_ = true;
    stop(Status(StatusCode::kAborted,
                shutting_down ? "Tutti was shut down" : "Tutti was shut down: " + who));
    return false;
  }
  return true;
}

std::string Runtime::exchangeLeaveNotes(ProcessSet& global, const std::string& mine) {
  // 1. Every rank sends its note ("" when it is not stopping) to rank 0.
  // 2. Rank 0 names the ranks that stopped ("rank 2 left the job (exited with code 7)"),
  //    at most a few of them, and broadcasts that.
  Deadline deadline = deadlineAfter(config_.timeout_seconds);
  std::vector<std::string> notes = global.control->gather(mine.substr(0, 200), deadline);
  std::string who;
  if (global.rank == 0) {
    constexpr int kNamed = 4;
    int stopping = 0;
    for (size_t r = 0; r < notes.size(); ++r) {
      if (notes[r].empty()) continue;
      if (stopping++ < kNamed)
        who += (who.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " +
               notes[r];
    }
    if (stopping > kNamed) who += "; and " + std::to_string(stopping - kNamed) + " more ranks";
    if (who.empty()) who = "another rank called shutdown";
  }
  return global.control->broadcast(who, deadline);
}

void Runtime::enqueuePlan(const std::shared_ptr<ProcessSet>& set, std::vector<Response> plan,
                          const std::vector<int64_t>& bytes,
                          const std::shared_ptr<Timeline>& tl) {
  // A set change makes or removes sets (collective setup on their channels): the stream
  // runs everything before it first and nothing beside it. The ops between set changes go
  // as one RunPlan each.
  auto changes_sets = [](const Response& r) {
    return r.op == OpType::kAddProcessSet || r.op == OpType::kRemoveProcessSet;
  };
  RunPlan run{set, {}, 0, tl};
  auto flush = [&] {
    if (run.plan.empty()) return;
    stream_.enqueue(std::move(run));
    run = RunPlan{set, {}, 0, tl};
  };
  if (std::none_of(plan.begin(), plan.end(), changes_sets)) {  // the usual case: one command
    run.plan = std::move(plan);
    for (int64_t b : bytes)
      if (!checkedAdd(run.bytes, b, &run.bytes)) run.bytes = INT64_MAX;
    return flush();
  }
  for (size_t k = 0; k < plan.size(); ++k) {
    if (changes_sets(plan[k])) {
      flush();
      stream_.enqueue(ChangeSets{set, std::move(plan[k]), tl});
      continue;
    }
    run.plan.push_back(std::move(plan[k]));
    if (!checkedAdd(run.bytes, bytes[k], &run.bytes)) run.bytes = INT64_MAX;
  }
  flush();
}

void Runtime::logRound(const ProcessSet& set, const std::vector<Response>& plan,
                       const std::vector<int64_t>& bytes, size_t cache_hits) const {
  std::string text = "round " + std::to_string(rounds_) + ", process set " +
                     std::to_string(set.id) + ": " + std::to_string(cache_hits) +
                     " cached op(s) ready on every member; runs";
  for (size_t k = 0; k < plan.size(); ++k) {
    const Response& r = plan[k];
    text += std::string(" [") + (r.type == ResponseType::kError ? "error " : "") +
            opTypeName(r.op) + " " + quotedName(r.names[0]);
    if (r.names.size() > 1) text += " + " + std::to_string(r.names.size() - 1) + " fused";
    text += ", " + std::to_string(bytes[k]) + " bytes]";
  }
  if (plan.empty()) text += " nothing";
  logLine(LogLevel::kDebug, text);
}

std::string Runtime::checkStalls(ProcessSet& set) {
  // Stall warnings (unless disabled) every TUTTI_STALL_CHECK_TIME_SECONDS; a fatal verdict
  // after TUTTI_STALL_SHUTDOWN_TIME_SECONDS when set, and always after TUTTI_TIMEOUT_SECONDS.
  if (!set.negotiator.coordinator().hasPending()) return "";
  const double warn_after =
      config_.stall_check_disable ? std::numeric_limits<double>::infinity()
                                  : config_.stall_check_seconds;
  const bool stall_stop =
      config_.stall_shutdown_seconds > 0 && config_.stall_shutdown_seconds < config_.timeout_seconds;
  const double stop_after = stall_stop ? config_.stall_shutdown_seconds : config_.timeout_seconds;
  auto now = Clock::now();
  for (const auto& stall :
       set.negotiator.coordinator().stalled(now, std::min(warn_after, stop_after))) {
    std::string what = std::string(opTypeName(stall.op)) + " '" + stall.name +
                       "' (process set " + std::to_string(set.id) + ") has waited " +
                       secondsText(stall.waited_seconds) +
                       " s for rank(s) " + joinInts(stall.missing_ranks);
    if (stall.waited_seconds >= stop_after)
      return stall_stop ? "stall shutdown: " + what + " (TUTTI_STALL_SHUTDOWN_TIME_SECONDS=" +
                              secondsText(stop_after) + ")"
                        : "timeout: " + what + ", which did not submit it (TUTTI_TIMEOUT_SECONDS=" +
                              secondsText(stop_after) + ")";
    if (stall.waited_seconds < warn_after) continue;
    auto& warned = stall_warned_[stall.name];
    if (now - warned >= std::chrono::duration<double>(warn_after)) {
      warned = now;
      TUTTI_LOG(kWarning) << "stall: " << what
                          << "; those ranks have not submitted it (different names, order of "
                             "ops, or a rank stopped early?)";
    }
  }
  return "";
}

}  // namespace tutti
