// Pipelined rounds: the background thread negotiates round k+1 while this thread runs
// round k's plan. Batches run one after another in the order they were pushed, which is the
// agreed order (every rank plans the same batches in the same rounds), so every backend
// sees the same sequence of collectives on every rank. The control planes (negotiation) and
// the backends (data) are separate channels, so the two threads never share one.
//
// A batch that fails (a backend error or timeout) is fatal: the executor thread reports it
// through `on_error` (the Runtime records it, aborts every set and wakes the background
// thread) and runs nothing more; the batches left keep their entries in the queues, where
// the Runtime's stop fails them.
#pragma once

#include "core/executor.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tutti {

class Pipeline {
 public:
  struct Batch {
    std::shared_ptr<ProcessSet> set;
    std::vector<Response> plan;  // run in order
    std::shared_ptr<Timeline> timeline;  // null when off
    int64_t tensors = 0;  // in the plan, for pendingTensors()
  };

  Pipeline(Executor& executor, std::function<void(const Status&)> on_error)
      : executor_(executor), on_error_(std::move(on_error)) {}
  ~Pipeline() { stop(); }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Starts the executor thread (once).
  void start();
  bool onThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  void push(Batch batch);
  // Waits until every batch pushed so far has run. Returns false, with *why saying so, when
  // one failed or when no batch finished for `stall_seconds` (a backend past its deadline).
  bool drain(double stall_seconds, Status* why);
  // No batch queued or running (then only the pushing thread can give it one).
  bool idle() const;
  // The first failure of a batch; OK while none failed.
  Status failure() const;
  // Tensors in batches pushed and not finished: entries still in the queues that need no
  // more negotiation.
  int64_t pendingTensors() const;
  // Stops the thread after the batch it runs; the batches left are dropped. Idempotent.
  void stop();

 private:
  void loop();

  Executor& executor_;
  std::function<void(const Status&)> on_error_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the executor thread waits for batches
  std::condition_variable done_cv_;  // drain() waits for the queue to empty
  std::vector<Batch> queue_;         // under mu_; front first
  size_t head_ = 0;                  // under mu_: next batch to run
  bool running_batch_ = false;       // under mu_
  int64_t pending_tensors_ = 0;      // under mu_
  uint64_t finished_ = 0;            // under mu_: batches finished so far
  bool stopping_ = false;            // under mu_
  bool sleeping_ = false;            // under mu_: the executor thread waits on work_cv_
  std::atomic<uint64_t> pushed_{0};  // batches pushed so far (watched without the lock)
  Status failure_;                   // under mu_
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace tutti
