#include "core/handle_table.h"

#include <thread>
#include <vector>

namespace tutti {

std::shared_ptr<HandleState> HandleTable::create(int parts, Callback callback) {
  auto state = std::make_shared<HandleState>();
  state->remaining = parts;
  state->callback = std::move(callback);
  state->owner = this;
  std::lock_guard<std::mutex> lock(mu_);
  state->id = next_++;
  handles_[state->id] = state;
  return state;
}

std::shared_ptr<HandleState> HandleTable::find(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
}

void HandleTable::release(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  handles_.erase(handle);
}

void HandleTable::complete(HandleState& state, const Status& status) {
  Callback callback;
  Status final_status;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.done) return;
    if (!status.ok() && state.status.ok()) state.status = status;
    if (--state.remaining > 0) return;
    state.done = true;
    callback = std::move(state.callback);
    final_status = state.status;
  }
  state.cv.notify_all();
  if (callback) {
    callback(state.id, final_status);
    if (state.owner) state.owner->retire(state.id);
  }
}

void HandleTable::retire(Handle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  called_back_.push_back(handle);
  while (called_back_.size() > kKeepCalledBack) {
    handles_.erase(called_back_.front());
    called_back_.pop_front();
  }
}

Status HandleTable::wait(HandleState& state, Deadline deadline) {
  // A short spin first: a small op often finishes within microseconds, and a futex
  // sleep/wake costs more than that.
  auto spin_until = Clock::now() + std::chrono::microseconds(30);
  while (Clock::now() < spin_until) {
    {
      std::lock_guard<std::mutex> lock(state.mu);
      if (state.done) return state.status;
    }
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(state.mu);
  if (!state.cv.wait_until(lock, deadline, [&] { return state.done; }))
    return Status(StatusCode::kInProgress, "still running after the wait's timeout");
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
    if (state.done) return;
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
