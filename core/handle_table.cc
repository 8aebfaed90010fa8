#include "core/handle_table.h"

#include <thread>
#include <vector>

namespace tutti {

std::shared_ptr<HandleState> HandleTable::create(int parts, Callback callback) {
  auto state = std::allocate_shared<HandleState>(PoolAllocator<HandleState>(pool_));
  state->remaining = parts;
  state->callback = std::move(callback);
  state->owner = this;
  std::lock_guard<std::mutex> lock(mu_);
  state->id = next_++;
  nodes_.insert(handles_, state->id, state);
  return state;
}

std::shared_ptr<HandleState> HandleTable::find(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
}

std::shared_ptr<HandleState> HandleTable::findForWait(Handle handle, bool* released) {
  std::lock_guard<std::mutex> lock(mu_);
  *released = false;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return nullptr;
  std::shared_ptr<HandleState> state = std::move(it->second);
  if (state->done.load(std::memory_order_acquire)) {
    nodes_.take(handles_, it);
    *released = true;
  } else {
    it->second = state;
  }
  return state;
}

void HandleTable::release(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  if (it != handles_.end()) nodes_.take(handles_, it);
}

void HandleTable::complete(HandleState& state, const Status& status, bool wake) {
  Callback callback;
  Status final_status;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.done.load(std::memory_order_relaxed)) return;
    if (!status.ok() && state.status.ok()) state.status = status;
    if (--state.remaining > 0) return;
    callback = std::move(state.callback);
    final_status = state.status;
    state.done.store(true);  // sequentially consistent: pairs with sleepers_ (wake())
  }
  if (wake && state.owner) state.owner->wake();
  if (callback) {
    callback(state.id, final_status);
    if (state.owner) state.owner->retire(state.id);
  }
}

void HandleTable::wake() {
  if (sleepers_.load() == 0) return;
  std::lock_guard<std::mutex> lock(sleep_mu_);
  sleep_cv_.notify_all();
}

void HandleTable::retire(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  called_back_.push_back(handle);
  while (called_back_.size() > kKeepCalledBack) {
    auto it = handles_.find(called_back_.front());
    if (it != handles_.end()) nodes_.take(handles_, it);
    called_back_.pop_front();
  }
}

Status HandleTable::wait(HandleState& state, Deadline deadline) {
  if (state.done.load(std::memory_order_acquire)) return state.status;
  // A short spin first: a small op often finishes within microseconds, and a futex
  // sleep/wake costs more than that.
  const auto spin_until = std::min(deadline, Clock::now() + std::chrono::microseconds(30));
  while (Clock::now() < spin_until) {
    std::this_thread::yield();
    if (state.done.load(std::memory_order_acquire)) return state.status;
  }
  if (state.owner) return state.owner->sleepUntilDone(state, deadline);
  // Not made by a table (nothing does that today): poll until the deadline.
  while (!state.done.load(std::memory_order_acquire)) {
    if (Clock::now() >= deadline)
      return Status(StatusCode::kInProgress, "still running after the wait's timeout");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return state.status;
}

bool HandleTable::claim(HandleState& state, Result* result, bool* from_allocator) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.claimed) return false;
  state.claimed = true;
  if (from_allocator) *from_allocator = state.from_allocator;
  if (result) {
    *result = std::move(state.result);
    state.result.data = nullptr;  // a raw pointer: moving it leaves a copy behind
  }
  return true;
}

Status HandleTable::sleepUntilDone(HandleState& state, Deadline deadline) {
  std::unique_lock<std::mutex> lock(sleep_mu_);
  sleepers_.fetch_add(1);
  bool done = state.done.load();
  while (!done && sleep_cv_.wait_until(lock, deadline) == std::cv_status::no_timeout)
    done = state.done.load();
  done = done || state.done.load();
  sleepers_.fetch_sub(1);
  if (!done) return Status(StatusCode::kInProgress, "still running after the wait's timeout");
  return state.status;
}

std::string HandleState::what() const {
  return std::string(tensors > 1 ? "grouped " : "") + opTypeName(op) +
         (name.empty() ? "" : " '" + name + "'") +
         (tensors > 1 ? " (+" + std::to_string(tensors - 1) + " more)" : "") + " (process set " +
         std::to_string(process_set) + ")";
}

void HandleTable::fail(HandleState& state, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.done.load(std::memory_order_relaxed)) return;
    state.remaining = 1;
  }
  const std::string what = state.what();
  if (status.message().find(what) != std::string::npos)
    complete(state, status);
  else
    complete(state, Status(status.code(), what + ": " + status.message()));
}

void HandleTable::failAll(const Status& status) {
  std::vector<std::shared_ptr<HandleState>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& kv : handles_) open.push_back(kv.second);
  }
  for (auto& state : open) fail(*state, status);
}

}  // namespace tutti
