// The background thread's round (see runtime.h, steps 2-5): the bit vector, cache hits,
// negotiation, fusion and execution, and rank 0's stall checks.
#include "core/logging.h"
#include "core/runtime.h"

#include <algorithm>
#include <limits>

namespace tutti {
namespace {

bool bitSet(const std::vector<uint64_t>& bits, size_t i) { return (bits[i / 64] >> (i % 64)) & 1u; }
void clearBit(std::vector<uint64_t>& bits, size_t i) { bits[i / 64] &= ~(uint64_t(1) << (i % 64)); }

}  // namespace

namespace {

// Where a set's bits sit in the round's AND-allreduce: bit 0 "not shutting down", then per
// set "no new requests" and "nobody joined", then per set two word-aligned sections with a
// bit per cache slot: "I hold this cached op" and "this slot is still valid" (a rank clears
// the latter when it sees the slot's name with another signature).
struct BitLayout {
  BitLayout(size_t nsets, int64_t capacity) {
    size_t words = (1 + 2 * nsets + 63) / 64;
    section_words = static_cast<size_t>((capacity + 63) / 64);
    for (size_t i = 0; i < nsets; ++i) {
      hits.push_back((words + 2 * i * section_words) * 64);
      valid.push_back((words + (2 * i + 1) * section_words) * 64);
    }
    total_words = words + 2 * nsets * section_words;
  }
  size_t noNew(size_t set) const { return 1 + 2 * set; }
  size_t noJoin(size_t set) const { return 2 + 2 * set; }
  size_t hit(size_t set, int slot) const { return hits[set] + static_cast<size_t>(slot); }
  size_t validSlot(size_t set, int slot) const { return valid[set] + static_cast<size_t>(slot); }
  size_t section_words, total_words;
  std::vector<size_t> hits, valid;
};

void setBit(std::vector<uint64_t>& bits, size_t i) { bits[i / 64] |= uint64_t(1) << (i % 64); }

// Moves the set's waiting hits for which `drop(hit)` holds into `out`.
template <typename Drop>
void dropHits(ProcessSet& set, std::vector<Request>& out, Drop drop) {
  std::vector<CacheHit> kept;
  for (auto& hit : set.hits) {
    if (drop(hit))
      out.push_back(std::move(hit.request));
    else
      kept.push_back(std::move(hit));
  }
  set.hits.swap(kept);
}

// What a round did, for the timeline's rounds row.
struct RoundNotes {
  int64_t cache_hits = 0, negotiated = 0, batches = 0, bytes = 0;
};

// A hit that waits this long goes to full negotiation, where rank 0's stall inspector sees
// it (a hit alone is invisible to the coordinator).
constexpr std::chrono::seconds kHitPatience(1);

}  // namespace

bool Runtime::runRound(bool* had_work) {
  const std::vector<std::shared_ptr<ProcessSet>> sets = allSets();
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
  followCacheSetting(sets);
  // 1-2. Sort this rank's new requests into cache hits and misses; build the bit vector.
  BitLayout layout(sets.size(), config_.cache_capacity);
  std::vector<uint64_t> bits(layout.total_words, ~uint64_t(0));
  if (shutting_down) clearBit(bits, 0);
  std::vector<std::vector<Request>> misses(sets.size());
  std::vector<std::string> stall(sets.size());
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    misses[i].swap(set.demoted);
    const auto now = Clock::now();
    dropHits(set, misses[i], [&](const CacheHit& h) { return now - h.since > kHitPatience; });
    int64_t hit_count = 0, miss_count = 0;
    for (auto& q : set.queue.popNew()) {
      if (q.op == OpType::kJoin) set.joined = true;
      int slot = cache_on_ ? set.cache.lookup(q) : -1;
      (slot >= 0 ? hit_count : miss_count) += 1;
      if (tl) {
        tl->dequeued(set.id, q.op, q.name);
        tl->begin(set.id, q.op, q.name, negotiatePhaseName(q.op),
                  slot >= 0 ? "\"cache\":\"hit\"" : "");
      }
      if (slot >= 0) {
        set.hits.push_back(CacheHit{slot, std::move(q), now});
        continue;
      }
      int stale = cache_on_ ? set.cache.slotOfName(q.name) : -1;
      if (stale >= 0) clearBit(bits, layout.validSlot(i, stale));
      misses[i].push_back(std::move(q));
    }
    stats_.addCache(hit_count, miss_count);
    if (set.rank == 0) stall[i] = checkStalls(set);
    if (!misses[i].empty() || !stall[i].empty()) clearBit(bits, layout.noNew(i));
    if (set.joined) clearBit(bits, layout.noJoin(i));
    for (size_t w = 0; w < layout.section_words; ++w) bits[layout.hits[i] / 64 + w] = 0;
    for (const auto& hit : set.hits) setBit(bits, layout.hit(i, hit.slot));
  }
  const auto and_start = Clock::now();
  sets[0]->control->allreduceAnd(bits, deadlineAfter(config_.timeout_seconds));
  stats_.addTime(StatTime::kNegotiation, Clock::now() - and_start);
  // Every rank runs the same rounds (the AND above is collective), so each one reaches
  // this point in the same round: rank 0's autotune choice applies everywhere at once.
  if (config_.autotune && bitSet(bits, 0) && rounds_ % kTuneEveryRounds == 0) tune(*sets[0]);

  // 3-4. Cached ops every member holds, then negotiation, then execution, set by set.
  *had_work = false;
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    const bool someone_joined = !bitSet(bits, layout.noJoin(i));
    std::vector<Response> responses;
    std::vector<int> ready;
    if (someone_joined) {  // the coordinator must see every request while a rank is joined
      dropHits(set, misses[i], [](const CacheHit&) { return true; });
    } else {
      // A slot some rank found stale: every member negotiates its waiting hits in full.
      std::vector<int> invalid;
      for (int slot = 0; slot < set.cache.capacity(); ++slot)
        if (!bitSet(bits, layout.validSlot(i, slot))) invalid.push_back(slot);
      for (int slot : invalid) {
        dropHits(set, misses[i], [slot](const CacheHit& h) { return h.slot == slot; });
        set.cache.erase(slot);
      }
      for (int slot = 0; slot < set.cache.capacity(); ++slot)
        if (bitSet(bits, layout.hit(i, slot)) && bitSet(bits, layout.validSlot(i, slot)))
          ready.push_back(slot);
      for (int slot : ready) responses.push_back(set.cache.response(slot));
      std::vector<Request> ignored;  // their entries run from the cached responses
      dropHits(set, ignored, [&](const CacheHit& h) {
        return std::binary_search(ready.begin(), ready.end(), h.slot);
      });
    }
    const bool negotiates = !bitSet(bits, layout.noNew(i)) || someone_joined;
    if (!negotiates && ready.empty()) continue;
    *had_work = true;
    size_t first_negotiated = responses.size();
    if (negotiates) {
      std::string fatal = stall[i];
      const auto start = Clock::now();
      negotiate(set, std::move(misses[i]), !stall[i].empty(), &responses, &fatal, tl.get());
      stats_.addTime(StatTime::kNegotiation, Clock::now() - start);
      if (!fatal.empty()) throwError(StatusCode::kTimeout, fatal);
    }
    notes.cache_hits += static_cast<int64_t>(ready.size());
    notes.negotiated += static_cast<int64_t>(responses.size() - first_negotiated);
    // The cache learns this round's agreements, in agreed order, before execution takes the
    // entries (every member holds an identical request for each). A hit still waiting for
    // a slot that gets replaced is negotiated in full next round.
    if (!someone_joined && cache_on_) {
      for (int slot : ready) set.cache.touch(slot);
      for (size_t k = first_negotiated; k < responses.size(); ++k) {
        const Response& r = responses[k];
        if (r.type != ResponseType::kOp || r.names.size() != 1) continue;
        auto q = set.queue.peek(r.names[0]);
        if (!q) continue;
        int replaced = set.cache.put(*q, r);
        if (replaced >= 0)
          dropHits(set, set.demoted, [replaced](const CacheHit& h) { return h.slot == replaced; });
      }
    }
    if (tl)  // agreed: each tensor now waits for its fused batch to run
      for (const auto& r : responses)
        for (const auto& name : r.names) {
          tl->end(set.id, r.op, name);
          tl->begin(set.id, r.op, name, "WAIT_FOR_BATCH");
        }
    const std::vector<Response> plan = planFusion(std::move(responses), tuned_.fusion_threshold);
    if (logEnabled(LogLevel::kDebug)) logRound(set, plan, ready.size());
    for (const auto& response : plan) {
      notes.batches += 1;
      for (int64_t c : response.counts) notes.bytes += c * dataTypeSize(response.dtype);
      if (response.op == OpType::kAddProcessSet || response.op == OpType::kRemoveProcessSet) {
        applySetChange(response);
        if (tl) tl->endAll(set.id, response.op, response.names[0]);
      } else {
        executor_.run(response, set, tl.get());
      }
      if (response.op == OpType::kJoin) set.joined = false;
    }
  }
  stats_.addRound(*had_work);
  if (tl && *had_work)
    tl->round(round_start, "\"round\":" + std::to_string(rounds_) +
                               ",\"cache_hits\":" + std::to_string(notes.cache_hits) +
                               ",\"negotiated\":" + std::to_string(notes.negotiated) +
                               ",\"batches\":" + std::to_string(notes.batches) +
                               ",\"bytes\":" + std::to_string(notes.bytes));
  for (auto& set : sets)
    if (set->member() && !set->demoted.empty()) *had_work = true;  // negotiate them at once
  // 5. Shutdown: every rank learns it in the same round, then who stopped and why.
  if (!bitSet(bits, 0)) {
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

void Runtime::followCacheSetting(const std::vector<std::shared_ptr<ProcessSet>>& sets) {
  // Autotune switched the cache in the last round, at the same round on every rank: now,
  // before any rank builds its bits, every rank empties its caches (identically) and sends
  // its waiting hits to full negotiation. A cache switched back on starts empty.
  if (cache_on_ == tuned_.cache) return;
  cache_on_ = tuned_.cache;
  for (const auto& set : sets) {
    if (!set->member()) continue;
    dropHits(*set, set->demoted, [](const CacheHit&) { return true; });
    set->cache.clear();
  }
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

void Runtime::negotiate(ProcessSet& set, std::vector<Request> mine, bool stall_fatal_root,
                        std::vector<Response>* responses, std::string* fatal, Timeline* tl) {
  RequestList list;
  list.requests = std::move(mine);
  Deadline deadline = deadlineAfter(config_.timeout_seconds);
  std::vector<std::string> gathered = set.control->gather(serialize(list), deadline);
  std::string answer;
  if (set.rank == 0) {
    auto now = Clock::now();
    std::vector<Request> arrived;
    for (int r = 0; r < set.size(); ++r) {
      auto requests = parseRequestList(gathered[r]).requests;
      set.coordinator.addRequests(r, requests, now);
      if (tl)
        for (auto& q : requests) {
          tl->instant(set.id, q.op, q.name, "REQUEST", "\"rank\":" + std::to_string(r));
          arrived.push_back(std::move(q));
        }
    }
    if (tl) markMissing(set, arrived, now, tl);
    ResponseList out;
    out.responses = set.coordinator.takeReady();
    if (stall_fatal_root) out.fatal_error = *fatal;
    answer = serialize(out);
  }
  ResponseList in = parseResponseList(set.control->broadcast(answer, deadline));
  *fatal = in.fatal_error;
  for (auto& r : in.responses) responses->push_back(std::move(r));
}

void Runtime::markMissing(ProcessSet& set, const std::vector<Request>& arrived,
                          Clock::time_point now, Timeline* tl) {
  // Rank 0 of the set: each tensor that got requests this round but still waits for some
  // ranks shows which, on its row.
  for (const auto& stall : set.coordinator.stalled(now, 0)) {
    auto it = std::find_if(arrived.begin(), arrived.end(),
                           [&](const Request& q) { return q.name == stall.name; });
    if (it == arrived.end()) continue;
    std::string missing;
    for (int r : stall.missing_ranks) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    tl->instant(set.id, it->op, it->name, "WAITING_FOR_RANKS", "\"missing\":[" + missing + "]");
  }
}

void Runtime::logRound(const ProcessSet& set, const std::vector<Response>& plan,
                       size_t cache_hits) const {
  std::string text = "round " + std::to_string(rounds_) + ", process set " +
                     std::to_string(set.id) + ": " + std::to_string(cache_hits) +
                     " cached op(s) ready on every member; runs";
  for (const auto& r : plan) {
    int64_t bytes = 0;
    for (int64_t c : r.counts) bytes += c * dataTypeSize(r.dtype);
    text += std::string(" [") + (r.type == ResponseType::kError ? "error " : "") +
            opTypeName(r.op) + " " + quotedName(r.names[0]);
    if (r.names.size() > 1) text += " + " + std::to_string(r.names.size() - 1) + " fused";
    text += ", " + std::to_string(bytes) + " bytes]";
  }
  if (plan.empty()) text += " nothing";
  logLine(LogLevel::kDebug, text);
}

std::string Runtime::checkStalls(ProcessSet& set) {
  // Stall warnings (unless disabled) every TUTTI_STALL_CHECK_TIME_SECONDS; a fatal verdict
  // after TUTTI_STALL_SHUTDOWN_TIME_SECONDS when set, and always after TUTTI_TIMEOUT_SECONDS.
  if (!set.coordinator.hasPending()) return "";
  const double warn_after =
      config_.stall_check_disable ? std::numeric_limits<double>::infinity()
                                  : config_.stall_check_seconds;
  const bool stall_stop =
      config_.stall_shutdown_seconds > 0 && config_.stall_shutdown_seconds < config_.timeout_seconds;
  const double stop_after = stall_stop ? config_.stall_shutdown_seconds : config_.timeout_seconds;
  auto now = Clock::now();
  for (const auto& stall : set.coordinator.stalled(now, std::min(warn_after, stop_after))) {
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
