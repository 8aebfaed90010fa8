// One process set's agreement, round by round, on which of its ops run and in what order.
// Owns the set's response cache and coordinator (which decides on the set's rank 0 only) and
// what lasts between rounds: cache hits waiting for the other members, requests demoted to
// full negotiation, and whether this rank's join is in flight.
//
// Every round, on every member, for every set in id order:
//   1. contribute(): this rank's new requests become cache hits or misses, and the set's bits
//      in the round's vector say "no new requests", "nobody joined", which cached ops this
//      rank holds and which slots are still valid (a rank clears a slot's valid bit when it
//      sees the slot's name with another signature).
//   2. The Runtime ANDs the whole vector over the global control plane (one call for all).
//   3. agree(): from everyone's bits, the cached ops every member holds (slot order), then,
//      when some member has new requests or has joined, the responses the coordinator
//      decided, gathered and broadcast over the set's control plane. The cache learns them in
//      that order, so it stays identical on every member.
// The bits alone decide whether a set gathers, so every member takes the same path.
// Background thread only.
#pragma once

#include "backends/backend.h"
#include "core/coordinator.h"
#include "core/response_cache.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {

// The round's AND-allreduce vector: bit 0 "not shutting down", then per set "no new
// requests" and "nobody joined", then per set two word-aligned sections with one bit per
// cache slot: "I hold this cached op" and "this slot is still valid". Starts all ones.
class RoundBits {
 public:
  RoundBits(size_t nsets, int64_t cache_capacity);
  std::vector<uint64_t>& words() { return words_; }
  bool test(size_t i) const { return (words_[i / 64] >> (i % 64)) & 1u; }
  void set(size_t i) { words_[i / 64] |= uint64_t(1) << (i % 64); }
  void clear(size_t i) { words_[i / 64] &= ~(uint64_t(1) << (i % 64)); }

  bool running() const { return test(0); }
  void clearRunning() { clear(0); }

  // Set `set`'s bits.
  size_t noNew(size_t set) const { return 1 + 2 * set; }
  size_t noJoin(size_t set) const { return 2 + 2 * set; }
  size_t hit(size_t set, int slot) const { return hits(set) + static_cast<size_t>(slot); }
  size_t valid(size_t set, int slot) const { return valids(set) + static_cast<size_t>(slot); }
  void clearHits(size_t set);  // the whole "I hold" section
  // Calls fn(slot) for each slot of `set`, in slot order, that every member holds (hit)
  // and that is still valid; stale(slot) for each slot some member found stale. Word by
  // word: a round costs the same whatever the cache's capacity. The bits come from every
  // rank: one past the capacity (in the last word) is an Error(kInternal), never an index.
  template <typename Ready, typename Stale>
  void scan(size_t set, Ready ready, Stale stale) const;

 private:
  [[noreturn]] void beyondCapacity(size_t set, int slot) const;
  size_t hits(size_t set) const { return (head_words_ + 2 * set * section_words_) * 64; }
  size_t valids(size_t set) const { return (head_words_ + (2 * set + 1) * section_words_) * 64; }
  int64_t capacity_;
  size_t head_words_, section_words_;
  std::vector<uint64_t> words_;
};

template <typename Ready, typename Stale>
void RoundBits::scan(size_t set, Ready ready, Stale stale) const {
  const uint64_t* hit = &words_[hits(set) / 64];
  const uint64_t* valid = &words_[valids(set) / 64];
  for (size_t w = 0; w < section_words_; ++w) {
    const int base = static_cast<int>(w * 64);
    // Past the capacity the valid bits stay ones and the hit bits zeros on every rank.
    const uint64_t beyond = base + 64 <= capacity_ ? 0 : ~uint64_t(0) << (capacity_ - base);
    if ((~valid[w] | hit[w]) & beyond)
      beyondCapacity(set, base + __builtin_ctzll((~valid[w] | hit[w]) & beyond));
    for (uint64_t b = ~valid[w]; b; b &= b - 1) stale(base + __builtin_ctzll(b));
    for (uint64_t b = hit[w] & valid[w]; b; b &= b - 1) ready(base + __builtin_ctzll(b));
  }
}

// What agree() decided for one set this round.
struct Agreement {
  bool active = false;              // something ran or was negotiated: a round with work
  // In agreed order (cached ops first, then negotiated ones), fused into batches by
  // planFusion with agree()'s fusion threshold (0: one response per op, unfused).
  std::vector<Response> responses;
  size_t cached = 0;                // ops agreed from the cache this round
  size_t negotiated = 0;            // ops negotiated in full this round
  Clock::duration negotiation{};    // time spent gathering and broadcasting
};

class Negotiator {
 public:
  // `rank` is this process's index in the set (-1 when not a member, which never calls it).
  Negotiator(int set_id, int rank, int size, int64_t cache_capacity);

  // Step 1. `fresh` are the requests this rank submitted since the last round, read in
  // place in their queue entries (TensorQueue::popNew): the negotiator keeps the pointers
  // until the requests are agreed on (an entry is taken only after that) or forget() drops
  // them. `stall` is rank 0's fatal stall verdict ("" when none; a verdict forces a
  // negotiation, which delivers it to every member). Counts the cache's hits and misses
  // into *hits, *misses.
  void contribute(const std::vector<const Request*>& fresh, std::string stall, RoundBits& bits,
                  size_t index, Timeline* tl, int64_t* hits, int64_t* misses);
  // Step 3, after the AND. Throws Error(kTimeout) with rank 0's fatal stall verdict, on
  // every member. `queue` gives the requests behind negotiated responses (for the cache).
  // The responses come fused into batches of up to `fusion_threshold` bytes (planFusion).
  Agreement agree(const RoundBits& bits, size_t index, ControlPlane& control,
                  const TensorQueue& queue, Deadline deadline, Timeline* tl,
                  int64_t fusion_threshold = 0);

  // Autotune's switch, applied at the same round on every member before contribute(): off
  // empties the cache and sends the waiting hits to full negotiation; on starts empty.
  void useCache(bool on);
  // The set is removed (its queue's entries go): drops every request it points at, waiting
  // hits, demoted requests and this round's misses. The cache stays as it is.
  void forget();
  // Requests demoted to full negotiation wait: the next round should come at once.
  bool hasDemoted() const { return !demoted_.empty(); }
  // Rank 0: the table of requests still waiting for some members (stall checks).
  const Coordinator& coordinator() const { return coordinator_; }

 private:
  // Requests are their queue entries', read in place (contribute()).
  using Requests = std::vector<const Request*>;
  struct CacheHit {
    int slot;
    const Request* request;
    Clock::time_point since;
  };
  // Moves the waiting hits for which `drop(hit)` holds into `*out` (dropped when null).
  template <typename Drop>
  void dropHits(Requests* out, Drop drop);
  // dropHits() for hits that go to full negotiation: with each one, the other waiting hits
  // of its group (the coordinator holds a group back until all its tensors arrive). The
  // slots of the hits demoted go to demoted_slots_ as well.
  template <typename Drop>
  void demoteHits(Requests& out, Drop drop);
  // demoteHits()' parts: a group to demote (once; "" is none), and dropHits() of the hits
  // for which `drop` holds or whose group was noted, their slots kept in demoted_slots_.
  void noteDemotedGroup(const std::string& group);
  template <typename Drop>
  void dropHitsWithGroups(Requests& out, Drop drop);
  void negotiate(ControlPlane& control, Deadline deadline, Timeline* tl,
                 std::vector<Response>* responses);
  void markMissing(const std::vector<Request>& arrived, Clock::time_point now, Timeline* tl);
  // parse(), its Error prefixed with the set and the rank (in the set) the bytes came from.
  template <typename Parse>
  auto fromPeer(int rank, const char* who, Parse parse) const -> decltype(parse());
  std::string fromRoot(const Response& r) const;  // "process set 1: from rank 0 ...: op 'x'"

  const int id_;
  const int rank_;
  const int size_;
  Coordinator coordinator_;
  ResponseCache cache_;
  bool cache_on_ = true;
  bool joined_ = false;            // this rank's join is in flight
  std::vector<CacheHit> hits_;     // hits waiting for the other members
  Requests demoted_;               // to negotiate in full next round
  Requests misses_;                // this round's, from contribute() to agree()
  std::vector<int> ready_;         // agree()'s cached slots, its capacity reused
  std::string stall_;              // this round's, from contribute() to agree()
  std::vector<std::string> demoted_groups_;  // demoteHits()' scratch
  std::vector<int> demoted_slots_;           // demoteHits()' slots, read by agree()
};

}  // namespace tutti
