#include "core/response_cache.h"

#include <cstring>

namespace tutti {

bool ResponseCache::cacheable(const Request& q) {
  return q.op == OpType::kAllreduce || q.op == OpType::kBroadcast ||
         q.op == OpType::kReducescatter;
}

// Only the fields the coordinator checks for this op: a field it ignores (allreduce's root)
// may differ between ranks and must not make their caches differ.
void ResponseCache::key(const Request& q, std::string* out) {
  std::string& k = *out;
  k.clear();
  k.reserve(q.name.size() + q.group.size() + 40 + q.shape.size() * sizeof(int64_t));
  auto put = [&k](const void* p, size_t n) { k.append(static_cast<const char*>(p), n); };
  uint8_t kinds[3] = {static_cast<uint8_t>(q.op), static_cast<uint8_t>(q.dtype),
                      static_cast<uint8_t>(q.device)};
  put(kinds, sizeof kinds);
  if (q.op == OpType::kBroadcast) {
    put(&q.root, sizeof q.root);
  } else {
    uint8_t op = static_cast<uint8_t>(q.reduce_op);
    put(&op, 1);
    put(&q.prescale, sizeof q.prescale);
    put(&q.postscale, sizeof q.postscale);
  }
  uint32_t ndim = static_cast<uint32_t>(q.shape.size());
  put(&ndim, sizeof ndim);
  if (ndim) put(q.shape.data(), ndim * sizeof(int64_t));
  // A grouped op's group (its key names the group's first tensor and its size): the same
  // tensor in another group, or outside any, is another signature.
  const int32_t group_size = q.group.empty() ? 0 : q.group_size;
  put(&group_size, sizeof group_size);
  const uint32_t group_chars = static_cast<uint32_t>(q.group.size());
  put(&group_chars, sizeof group_chars);
  k += q.group;
  k += q.name;
}

int ResponseCache::lookup(const Request& q) const {
  if (slots_.empty() || !cacheable(q)) return -1;
  key(q, &scratch_);  // the steady state looks up every tensor every step: no allocation
  auto it = index_.find(scratch_);
  return it == index_.end() ? -1 : it->second;
}

int ResponseCache::slotOfName(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
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
  index_.erase(s.key);
  by_name_.erase(s.name);
  s = Slot();
}

int ResponseCache::put(const Request& q, const Response& r) {
  if (slots_.empty() || !cacheable(q)) return -1;
  std::string k;
  key(q, &k);
  auto it = index_.find(k);
  int slot, replaced = -1;
  if (it != index_.end()) {
    slot = it->second;
  } else {
    int same_name = slotOfName(q.name);
    if (same_name >= 0) {
      slot = same_name;
    } else {
      slot = 0;
      for (size_t i = 1; i < slots_.size(); ++i)
        if (slots_[i].last_used < slots_[slot].last_used) slot = static_cast<int>(i);
    }
    if (slots_[slot].last_used != 0) {
      replaced = slot;
      erase(slot);
    }
    slots_[slot].key = k;
    slots_[slot].name = q.name;
    index_[k] = slot;
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
