#include "core/response_cache.h"

#include <cstring>

namespace tutti {

bool ResponseCache::cacheable(const Request& q) {
  return q.group.empty() && (q.op == OpType::kAllreduce || q.op == OpType::kBroadcast ||
                             q.op == OpType::kReducescatter);
}

// Only the fields the coordinator checks for this op: a field it ignores (allreduce's root)
// may differ between ranks and must not make their caches differ.
std::string ResponseCache::key(const Request& q) {
  Request k;
  k.op = q.op;
  k.name = q.name;
  k.dtype = q.dtype;
  k.device = q.device;
  k.shape = q.shape;
  if (q.op == OpType::kBroadcast) {
    k.root = q.root;
  } else {
    k.reduce_op = q.reduce_op;
    k.prescale = q.prescale;
    k.postscale = q.postscale;
  }
  RequestList list;
  list.requests.push_back(std::move(k));
  return serialize(list);
}

int ResponseCache::lookup(const Request& q) const {
  if (slots_.empty() || !cacheable(q)) return -1;
  auto it = index_.find(key(q));
  return it == index_.end() ? -1 : it->second;
}

void ResponseCache::put(const Request& q, const Response& r) {
  if (slots_.empty() || !cacheable(q)) return;
  std::string k = key(q);
  auto it = index_.find(k);
  int slot;
  if (it != index_.end()) {
    slot = it->second;
  } else {
    slot = 0;
    for (size_t i = 1; i < slots_.size(); ++i)
      if (slots_[i].last_used < slots_[slot].last_used) slot = static_cast<int>(i);
    if (slots_[slot].last_used != 0) index_.erase(slots_[slot].key);
    slots_[slot].key = k;
    index_[k] = slot;
  }
  slots_[slot].response = r;
  touch(slot);
}

}  // namespace tutti
