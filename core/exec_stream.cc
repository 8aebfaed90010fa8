#include "core/exec_stream.h"

#include "backends/registry.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>

namespace tutti {
namespace {

int64_t tensorsOf(const StreamCommand& command) {
  const auto* plan = std::get_if<RunPlan>(&command);
  if (!plan) return 0;
  int64_t tensors = 0;
  for (const auto& r : plan->plan) tensors += static_cast<int64_t>(r.names.size());
  return tensors;
}

}  // namespace

bool ExecStream::wantsThread(const Config& config) {
  if (config.pipeline != "auto") return config.pipeline == "1";
  // The cores this rank has: its affinity mask where it was bound to fewer than the host
  // has, else the host's shared by the ranks on it.
  const int usable = usableCores();
  const int host = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int mine = usable < host ? usable : usable / std::max(1, config.topology.local_size);
  return mine >= 3;
}

void ExecStream::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  threaded_ = true;
  thread_ = std::thread([this] { loop(); });
  thread_id_.store(thread_.get_id());
}

void ExecStream::run(StreamCommand& command) {
  if (auto* p = std::get_if<RunPlan>(&command)) {
    for (const auto& response : p->plan) executor_.run(response, *p->set, p->timeline.get());
  } else if (auto* c = std::get_if<ChangeSets>(&command)) {
    change_sets_(c->response);
    if (c->timeline) c->timeline->endAll(c->set->id, c->response.op, c->response.names[0]);
  } else if (auto* s = std::get_if<SetBackendSwitch>(&command)) {
    for (const auto& set : s->sets)
      if (set->member()) setBackendSwitch(set->backends, s->which, s->on);
  }
}

void ExecStream::enqueue(StreamCommand command) {
  if (!threaded_) return run(command);
  if (std::holds_alternative<ChangeSets>(command)) {
    drain();
    return run(command);
  }
  const auto* plan = std::get_if<RunPlan>(&command);
  if ((!plan || plan->bytes < kInlineBytes) && idle()) return run(command);
  const int64_t tensors = tensorsOf(command);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_tensors_ += tensors;
    queue_.push_back(std::move(command));
    pushed_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  // The stream's thread watches for work a little after each command: a push then costs no
  // system call.
  if (wake) work_cv_.notify_one();
}

void ExecStream::drain() {
  if (!threaded_) return;
  // A plan's backend calls have deadlines of TUTTI_TIMEOUT_SECONDS each: a stream that
  // finishes nothing for longer than that (and a little) is stuck.
  const double stall_seconds = config_.timeout_seconds + 5.0;
  std::unique_lock<std::mutex> lock(mu_);
  while ((head_ < queue_.size() || running_) && failure_.ok()) {
    const uint64_t finished = finished_;
    if (!done_cv_.wait_for(lock, std::chrono::duration<double>(stall_seconds), [&] {
          return finished_ != finished || !failure_.ok() ||
                 (head_ == queue_.size() && !running_);
        }))
      throwError(StatusCode::kTimeout,
                 "the execution stream finished no command in " + secondsText(stall_seconds) +
                     " s (TUTTI_TIMEOUT_SECONDS) while the background thread waited for it");
  }
  if (!failure_.ok()) throwError(failure_.code(), failure_.message());
}

bool ExecStream::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return head_ == queue_.size() && !running_;
}

Status ExecStream::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

int64_t ExecStream::pendingTensors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_tensors_;
}

void ExecStream::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable() && !onThread()) thread_.join();
}

void ExecStream::loop() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // as the background thread (short sleeps)
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (head_ == queue_.size() && !stopping_ && failure_.ok()) {
      // Right after a command the next one is often microseconds away (the background
      // thread negotiated it meanwhile): watch for it before paying for a futex sleep.
      const uint64_t seen = pushed_.load(std::memory_order_acquire);
      lock.unlock();
      const auto until = Clock::now() + std::chrono::microseconds(50);
      while (pushed_.load(std::memory_order_acquire) == seen && Clock::now() < until)
        std::this_thread::yield();
      lock.lock();
      sleeping_ = true;
      work_cv_.wait(lock, [this] { return head_ < queue_.size() || stopping_; });
      sleeping_ = false;
    }
    if (stopping_ || !failure_.ok()) return;
    StreamCommand command = std::move(queue_[head_++]);
    if (head_ == queue_.size()) {  // every command taken: reuse the storage
      queue_.clear();
      head_ = 0;
    }
    running_ = true;
    lock.unlock();
    const int64_t tensors = tensorsOf(command);
    Status failed;
    try {
      run(command);
    } catch (const Error& error) {
      failed = error.status();
    } catch (const std::exception& error) {
      failed = Status(StatusCode::kInternal, error.what());
    }
    if (auto* plan = std::get_if<RunPlan>(&command); plan && plan->timeline)
      plan->timeline->flush();
    if (!failed.ok()) on_error_(failed);  // aborts the sets: the background thread wakes
    command = SetBackendSwitch();  // let go of the sets and the timeline before it is done
    lock.lock();
    running_ = false;
    pending_tensors_ -= tensors;
    ++finished_;
    if (!failed.ok() && failure_.ok()) failure_ = failed;
    done_cv_.notify_all();
  }
}

}  // namespace tutti
