// The response cache of one process set: responses agreed before, keyed by everything the
// agreement depended on, so that a repeat (the same gradient next step) needs no gather and
// no broadcast, only its bit in the round's AND-allreduce.
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
  // The slot holding a response for exactly this request, or -1.
  int lookup(const Request& q) const;
  // The slot holding a response for this name with any other signature, or -1.
  int slotOfName(const std::string& name) const;
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
  static void key(const Request& q, std::string* out);
  size_t inside(int slot) const;  // checked index
  size_t held(int slot) const;    // checked index of a slot holding a response
  struct Slot {
    std::string key;
    std::string name;
    Response response;
    uint64_t last_used = 0;  // 0 = empty
  };
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int> index_;    // key -> slot
  std::unordered_map<std::string, int> by_name_;  // name -> slot
  uint64_t clock_ = 0;
  mutable std::string scratch_;  // lookup()'s key, its capacity reused
};

}  // namespace tutti
