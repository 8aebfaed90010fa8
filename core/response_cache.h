// The response cache of one process set: responses agreed before, one slot per tensor name,
// each with the signature its agreement depended on, so that a repeat (the same gradient next
// step) needs no gather and no broadcast, only its bit in the round's AND-allreduce.
//
// Identical on every member by construction: it changes only at the end of a round, in the
// round's agreed order (hits in slot order, then new responses in response order), with a
// deterministic LRU clock. Not thread-safe (background thread only).
#pragma once

#include "core/message.h"

#include <string>
#include <unordered_map>
#include <vector>

namespace tutti {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : slots_(static_cast<size_t>(capacity)) {}
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }

  // Allreduce, broadcast and reducescatter, grouped or not: ops whose response follows from
  // one rank's request once the ranks are known to agree. A group's tensors hit or miss
  // together (the Negotiator sends the whole group to full negotiation when one misses).
  static bool cacheable(const Request& q);
  // The slot holding a response for exactly this request, or -1: found by the request's
  // name (one hash of it, no key built), then its signature compared field by field.
  // *stale (when given) receives the slot holding this name for another op or signature
  // (uncacheable ops included), or -1.
  int lookup(const Request& q, int* stale = nullptr) const;
  // A slot (from the round's bits: another rank's data) outside the cache, or empty where
  // a response is read, is an Error(kInternal), never an index.
  const Response& response(int slot) const { return slots_[held(slot)].response; }
  void touch(int slot) { slots_[held(slot)].last_used = ++clock_; }
  // Stores `r` (agreed for `q`), replacing the least recently used entry when full.
  // Returns the slot whose previous entry was replaced, or -1.
  int put(const Request& q, const Response& r);
  void erase(int slot);
  void clear();  // every slot (autotune turning the cache off)

 private:
  // Whether `q` asks for what `cached` was agreed for: only the fields the coordinator
  // checks for this op (a field it ignores, allreduce's root, may differ between ranks and
  // must not make their caches differ). The process set is the cache's own.
  static bool sameSignature(const Request& cached, const Request& q);
  size_t inside(int slot) const;  // checked index
  size_t held(int slot) const;    // checked index of a slot holding a response
  struct Slot {
    Request request;  // the signature the response was agreed for (its name included)
    Response response;
    uint64_t last_used = 0;  // 0 = empty
  };
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> by_name_;  // name -> slot
  uint64_t clock_ = 0;
};

}  // namespace tutti
