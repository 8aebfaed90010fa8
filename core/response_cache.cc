#include "core/response_cache.h"

#include <cstring>

namespace tutti {

bool ResponseCache::cacheable(const Request& q) {
  return q.op == OpType::kAllreduce || q.op == OpType::kBroadcast ||
         q.op == OpType::kReducescatter;
}

namespace {

// Scale factors compare as bits, so that any value (NaN, -0.0) hits only itself.
bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

bool ResponseCache::sameSignature(const Request& cached, const Request& q) {
  if (cached.op != q.op || cached.dtype != q.dtype || cached.device != q.device) return false;
  if (q.op == OpType::kBroadcast) {
    if (cached.root != q.root) return false;
  } else if (cached.reduce_op != q.reduce_op || !sameBits(cached.prescale, q.prescale) ||
             !sameBits(cached.postscale, q.postscale)) {
    return false;
  }
  // A grouped op's group (named by its first tensor and its size): the same tensor in
  // another group, or outside any, is another signature.
  const int32_t cached_group = cached.group.empty() ? 0 : cached.group_size;
  const int32_t group = q.group.empty() ? 0 : q.group_size;
  return cached.shape == q.shape && cached_group == group && cached.group == q.group;
}

int ResponseCache::lookup(const Request& q, int* stale) const {
  if (stale) *stale = -1;
  if (slots_.empty()) return -1;
  auto it = by_name_.find(q.name);  // the steady state looks up every tensor every step
  if (it == by_name_.end()) return -1;
  if (cacheable(q) && sameSignature(slots_[static_cast<size_t>(it->second)].request, q))
    return it->second;
  if (stale) *stale = it->second;  // any other op or signature under the name
  return -1;
}

size_t ResponseCache::inside(int slot) const {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size())
    throwError(StatusCode::kInternal, "response cache slot " + std::to_string(slot) +
                                          " is outside the cache of " +
                                          std::to_string(slots_.size()) + " slots");
  return static_cast<size_t>(slot);
}

size_t ResponseCache::held(int slot) const {
  const size_t i = inside(slot);
  if (slots_[i].last_used == 0)
    throwError(StatusCode::kInternal, "response cache slot " + std::to_string(slot) +
                                          " is empty on this rank but ready on every member");
  return i;
}

void ResponseCache::erase(int slot) {
  Slot& s = slots_[inside(slot)];
  if (s.last_used == 0) return;
  by_name_.erase(s.request.name);
  s = Slot();
}

int ResponseCache::put(const Request& q, const Response& r) {
  if (slots_.empty() || !cacheable(q)) return -1;
  int stale = -1;
  int slot = lookup(q, &stale), replaced = -1;
  if (slot < 0) {
    // The name's slot when it holds another signature, else the least recently used one.
    slot = stale;
    if (slot < 0) {
      slot = 0;
      for (size_t i = 1; i < slots_.size(); ++i)
        if (slots_[i].last_used < slots_[slot].last_used) slot = static_cast<int>(i);
    }
    if (slots_[slot].last_used != 0) {
      replaced = slot;
      erase(slot);
    }
    slots_[slot].request = q;
    by_name_[q.name] = slot;
  }
  slots_[slot].response = r;
  slots_[slot].last_used = ++clock_;
  return replaced;
}

void ResponseCache::clear() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].last_used != 0) erase(static_cast<int>(i));
}

}  // namespace tutti
