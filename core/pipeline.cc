#include "core/pipeline.h"

#include <sys/prctl.h>

#include <chrono>

namespace tutti {

void Pipeline::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { loop(); });
  thread_id_.store(thread_.get_id());
}

void Pipeline::push(Batch batch) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_tensors_ += batch.tensors;
    queue_.push_back(std::move(batch));
    pushed_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  // The executor thread watches for work a little after each batch: a push then costs no
  // system call.
  if (wake) work_cv_.notify_one();
}

bool Pipeline::drain(double stall_seconds, Status* why) {
  std::unique_lock<std::mutex> lock(mu_);
  while (head_ < queue_.size() || running_batch_) {
    if (!failure_.ok()) break;
    const uint64_t finished = finished_;
    if (!done_cv_.wait_for(lock, std::chrono::duration<double>(stall_seconds), [&] {
          return finished_ != finished || !failure_.ok() ||
                 (head_ == queue_.size() && !running_batch_);
        })) {
      *why = Status(StatusCode::kTimeout,
                    "the executor thread finished no batch in " + secondsText(stall_seconds) +
                        " s (TUTTI_TIMEOUT_SECONDS) while the background thread waited for it");
      return false;
    }
  }
  if (!failure_.ok()) {
    *why = failure_;
    return false;
  }
  return true;
}

bool Pipeline::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return head_ == queue_.size() && !running_batch_;
}

Status Pipeline::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

int64_t Pipeline::pendingTensors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_tensors_;
}

void Pipeline::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable() && !onThread()) thread_.join();
}

void Pipeline::loop() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // as the background thread (short sleeps)
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (head_ == queue_.size() && !stopping_ && failure_.ok()) {
      // Right after a batch the next one is often microseconds away (the background thread
      // negotiated it meanwhile): watch for it before paying for a futex sleep.
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
    Batch batch = std::move(queue_[head_++]);
    if (head_ == queue_.size()) {  // every batch taken: reuse the storage
      queue_.clear();
      head_ = 0;
    }
    running_batch_ = true;
    lock.unlock();
    Status failed;
    try {
      for (const auto& response : batch.plan) executor_.run(response, *batch.set, batch.timeline.get());
    } catch (const Error& error) {
      failed = error.status();
    } catch (const std::exception& error) {
      failed = Status(StatusCode::kInternal, error.what());
    }
    if (batch.timeline) batch.timeline->flush();
    if (!failed.ok()) on_error_(failed);  // aborts the sets: the background thread wakes
    const int64_t tensors = batch.tensors;
    batch = Batch();  // let go of the set and the timeline before reporting the batch done
    lock.lock();
    running_batch_ = false;
    pending_tensors_ -= tensors;
    ++finished_;
    if (!failed.ok() && failure_.ok()) failure_ = failed;
    done_cv_.notify_all();
  }
}

}  // namespace tutti
