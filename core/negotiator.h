// One process set's agreement, round by round, on which of its ops run and in what order.
// Owns the set's response cache and coordinator (which decides on the set's rank 0 only) and
// what lasts between rounds: cache hits waiting for the other members, requests demoted to
// full negotiation, and whether this rank's join is in flight.
//
// Every round, on every member, for every set in id order:
//   1. contribute(): this rank's new requests become ordered ops, cache hits or misses, and
//      the set's bits in the round's vector say "no new requests", "nobody joined", how many
//      of the next ordered ops this rank holds and their signatures, which cached ops it
//      holds and which slots are still valid (a rank clears a slot's valid bit when it sees
//      the slot's name with another signature).
//   2. The Runtime ANDs the whole vector over the global control plane (one call for all).
//   3. agree(): from everyone's bits, the cached ops every member holds (slot order), the
//      ordered ops every member holds with the same signature (in order), then, when some
//      member has new requests or has joined, the responses the coordinator decided,
//      gathered and broadcast over the set's control plane. The cache learns them in that
//      order, so it stays identical on every member.
// Ordered ops (Request::ordered: the caller issues them in the same order on every rank, as
// torch.distributed does) are agreed by position: the n-th ordered op of the set on one rank
// is the n-th on every other. Each rank sends, for each of the next kOrderedWindow it holds,
// a 64-bit hash of its signature (name included) and the hash's complement: after the AND,
// a position whose two words OR to all ones has the same hash on every member. Those run
// with responses built from this rank's own request; the first position whose hashes differ
// is negotiated in full on every member (where the difference is a mismatch error, or an
// allgather with uneven rows), and so is the next one when a member has waited for it
// longer than a second (the coordinator's stall checks then see it). Every decision comes
// from the AND, so the members' positions never drift apart. Once a member has joined, the
// set's ordered ops are negotiated in full for good.
// The bits alone decide whether a set gathers, so every member takes the same path.
// Background thread only.
#pragma once

#include "backends/backend.h"
#include "core/coordinator.h"
#include "core/response_cache.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace tutti {

// The round's AND-allreduce vector: bit 0 "not shutting down", then per set "no new
// requests" and "nobody joined"; per set an ordered section (a word of "I hold ordered op
// k" bits for the next kOrderedWindow positions, then a "keep waiting" bit, then each
// position's hash and its complement); then per set two word-aligned sections with one bit
// per cache slot: "I hold this cached op" and "this slot is still valid". Starts all ones.
class RoundBits {
 public:
  static constexpr int kOrderedWindow = 8;
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
  // The set's ordered section: word 0 holds bit k "I hold the k-th next ordered op" (k <
  // kOrderedWindow) and bit kOrderedWindow "nobody wants the next one negotiated in full";
  // words 1 + 2k and 2 + 2k the k-th op's signature hash and its complement.
  uint64_t* ordered(size_t set) { return &words_[orderedAt(set)]; }
  const uint64_t* ordered(size_t set) const { return &words_[orderedAt(set)]; }
  // Calls fn(slot) for each slot of `set`, in slot order, that every member holds (hit)
  // and that is still valid; stale(slot) for each slot some member found stale. Word by
  // word: a round costs the same whatever the cache's capacity. The bits come from every
  // rank: one past the capacity (in the last word) is an Error(kInternal), never an index.
  template <typename Ready, typename Stale>
  void scan(size_t set, Ready ready, Stale stale) const;

 private:
  [[noreturn]] void beyondCapacity(size_t set, int slot) const;
  static constexpr size_t kOrderedWords = 1 + 2 * kOrderedWindow;
  size_t orderedAt(size_t set) const { return head_words_ + set * kOrderedWords; }
  size_t cacheAt() const { return head_words_ + nsets_ * kOrderedWords; }
  size_t hits(size_t set) const { return (cacheAt() + 2 * set * section_words_) * 64; }
  size_t valids(size_t set) const { return (cacheAt() + (2 * set + 1) * section_words_) * 64; }
  int64_t capacity_;
  size_t nsets_, head_words_, section_words_;
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
  size_t ordered = 0;               // ordered ops agreed by position this round
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
  // Whether `q` may be agreed by position (Request::ordered and an op whose response
  // follows from one rank's request once every member's signature is the same).
  bool orderable(const Request& q) const;
  // The signature hash ordered ops are agreed by (everything the response depends on, and
  // the name).
  static uint64_t orderedHash(const Request& q);
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
  // contribute()'s and agree()'s parts for ordered ops.
  void contributeOrdered(RoundBits& bits, size_t index, Clock::time_point now);
  void agreeOrdered(const RoundBits& bits, size_t index, bool someone_joined,
                    std::vector<Response>* agreed);
  Response orderedResponse(const Request& q) const;
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
  // Ordered ops: this rank's, in order, from position ordered_head_ on (those not decided
  // yet); how many this rank has seen (its next one's position); how many the members have
  // decided (agreed, or sent to full negotiation: the same on every member); since when the
  // first of them waits; off for good once a member joined.
  struct Ordered {
    const Request* request;
    uint64_t hash;  // orderedHash(*request), taken once: a waiting op is sent every round
  };
  std::deque<Ordered> ordered_;
  int64_t ordered_seen_ = 0;
  int64_t ordered_head_ = 0;
  Clock::time_point ordered_since_{};
  bool ordered_off_ = false;
};

}  // namespace tutti
