#include "backends/loopback/loopback_group.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace tutti {
namespace detail {

LoopbackChannel::LoopbackChannel(LoopbackGroup& group, const char* kind)
    : group_(group),
      kind_(kind),
      arrived_(group.size(), 0),
      posts_(group.size()) {}

void LoopbackChannel::wakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

bool LoopbackChannel::arriveLocked(int member) {
  arrived_[member] = 1;
  if (++arrived_count_ < group_.size()) return false;
  arrived_count_ = 0;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  ++generation_;
  cv_.notify_all();
  return true;
}

void LoopbackChannel::arrive(int member, const LoopbackPost& post, Deadline deadline,
                             Clock::time_point start, const char* op) {
  std::unique_lock<std::mutex> lock(mu_);
  // Poison is checked under this lock, and a timeout poisons under it: once a member has
  // given up, no late member can complete the step and read its (soon freed) memory.
  group_.throwIfPoisoned();
  posts_[member] = post;
  if (arrived_count_ + 1 == group_.size()) {  // the last arrival grows the scratch
    int64_t needed = 0;
    for (const auto& p : posts_) needed = std::max(needed, p.scratch_bytes);
    if (static_cast<int64_t>(scratch_.size()) < needed) scratch_.resize(needed);
  }
  if (arriveLocked(member)) return;
  const uint64_t generation = generation_;
  while (generation_ == generation) {
    group_.throwIfPoisoned();
    if (cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
    if (generation_ != generation || group_.poisoned()) continue;
    std::vector<int> missing;
    for (int m = 0; m < group_.size(); ++m)
      if (!arrived_[m]) missing.push_back(group_.ranks()[m]);
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f",
                  std::chrono::duration<double>(deadline - start).count());
    group_.setPoison(StatusCode::kTimeout,
                     "rank " + std::to_string(group_.ranks()[member]) + ": loopback " + kind_ +
                         op + " on group " + std::to_string(group_.id()) + ": timed out after " +
                         seconds + " s waiting for rank(s) " + joinInts(missing));
    cv_.notify_all();
    lock.unlock();
    group_.wakeAll();
    group_.throwIfPoisoned();  // ours, or the error of whoever poisoned first
  }
}

void LoopbackChannel::depart(int member) {
  std::unique_lock<std::mutex> lock(mu_);
  if (arriveLocked(member)) return;
  const uint64_t generation = generation_;
  cv_.wait(lock, [&] { return generation_ != generation; });
}

LoopbackGroup::LoopbackGroup(std::vector<int> ranks, int id)
    : ranks_(std::move(ranks)), id_(id), data_(*this, ""), control_(*this, "control-plane ") {}

void LoopbackGroup::wakeAll() {
  data_.wakeAll();
  control_.wakeAll();
}

void LoopbackGroup::poison(StatusCode code, const std::string& message) {
  setPoison(code, message);
  wakeAll();
}

}  // namespace detail

LoopbackHub::LoopbackHub(int world_size) : world_size_(world_size) {
  if (world_size < 1)
    throwError(StatusCode::kInvalidArgument,
               "loopback hub: world size must be >= 1, got " + std::to_string(world_size));
}

std::shared_ptr<detail::LoopbackGroup> LoopbackHub::group(const std::vector<int>& ranks, int id,
                                                          int rank) {
  std::string who = "rank " + std::to_string(rank) + ": loopback group " + std::to_string(id);
  const std::string wrong = checkGroupRanks(ranks, world_size_, rank);
  if (!wrong.empty()) throwError(StatusCode::kInvalidArgument, who + ": " + wrong);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.expired())
      it = groups_.erase(it);
    else
      ++it;
  }
  auto& slot = groups_[id];
  if (auto existing = slot.lock()) {
    if (existing->ranks() != ranks)
      throwError(StatusCode::kInvalidArgument,
                 who + ": members disagree: this rank passed [" + joinInts(ranks) +
                     "], another passed [" + joinInts(existing->ranks()) + "]");
    return existing;
  }
  auto created = std::make_shared<detail::LoopbackGroup>(ranks, id);
  slot = created;
  return created;
}

}  // namespace tutti
