#include "core/tensor_queue.h"

#include <algorithm>
#include <set>

namespace tutti {
namespace {

struct Span {  // the entries add() was given
  TensorEntry* first;
  size_t count;
  TensorEntry* begin() const { return first; }
  TensorEntry* end() const { return first + count; }
};

}  // namespace

Status TensorQueue::add(TensorEntry* entries, size_t count, std::vector<std::string>* added) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> names;  // duplicates within a group (empty for one tensor)
  for (TensorEntry& e : Span{entries, count}) {
    if (e.request.name.empty()) {
      e.request.name = std::string(opTypeName(e.request.op)) + ".noname." +
                       std::to_string(noname_counters_[static_cast<int>(e.request.op)]++);
    }
    if (entries_.count(e.request.name) ||
        (count > 1 && !names.insert(e.request.name).second))
      return Status(StatusCode::kDuplicateName,
                    std::string(opTypeName(e.request.op)) + " '" + e.request.name +
                        "': a tensor of this name is already in flight on this rank; wait for "
                        "it before submitting the name again");
  }
  for (TensorEntry& e : Span{entries, count}) {
    if (added) added->push_back(e.request.name);
    // The entry's node does not move until take(): new_ points at its request, which the
    // background thread reads in place (popNew).
    auto it = nodes_.insertWith(entries_, e.request.name, [&e](Queued& into) {
      // copy-assigned: a reused node's strings keep their storage
      into.entry.request = e.request;
      into.entry.input = e.input;
      into.entry.output = e.output;
      into.entry.allocator = std::move(e.allocator);
      into.entry.handle = std::move(e.handle);
      into.unpopped = true;
      into.claimed = false;
    });
    new_.push_back(&it->second);
  }
  return Status::OK();
}

void TensorQueue::popNew(std::vector<const Request*>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Queued* q : new_) {
    q->unpopped = false;
    out->push_back(&q->entry.request);
  }
  new_.clear();
}

void TensorQueue::forgetNew(Queued& q) {
  if (!q.unpopped) return;  // the steady state: popped before it was agreed on
  new_.erase(std::find(new_.begin(), new_.end(), &q));
  q.unpopped = false;
}

std::optional<TensorEntry> TensorQueue::take(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  forgetNew(it->second);
  return std::move(nodes_.take(entries_, it).entry);
}

void TensorQueue::take(const std::vector<std::string>& names, std::vector<Taken>* out,
                       bool claimed_only) {
  out->clear();  // an entry not recycled goes (with its storage)
  out->resize(names.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = entries_.find(names[i]);
    if (it == entries_.end() || (claimed_only && !it->second.claimed)) continue;
    forgetNew(it->second);
    (*out)[i].node_ = entries_.extract(it);
  }
}

void TensorQueue::claim(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& name : names) {
    auto it = entries_.find(name);
    if (it == entries_.end()) continue;
    forgetNew(it->second);
    it->second.claimed = true;
  }
}

void TensorQueue::recycle(std::vector<Taken>* taken) {
  for (Taken& t : *taken) {  // outside the lock: a callback's captures may be large
    if (!t) continue;
    t->allocator = nullptr;
    t->handle.reset();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Taken& t : *taken) nodes_.give(std::move(t.node_));
  taken->clear();
}

std::optional<Request> TensorQueue::peek(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.entry.request;
}

size_t TensorQueue::inFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::vector<TensorEntry> TensorQueue::takeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TensorEntry> out;
  for (auto& kv : entries_) out.push_back(std::move(kv.second.entry));
  entries_.clear();
  new_.clear();
  return out;
}

}  // namespace tutti
