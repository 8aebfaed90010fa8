// The execution stream: the one owner of a runtime's data plane. Only the commands it runs
// touch a process set's backends and the fusion buffer (its Executor's). The background
// thread's round enqueues them in the agreed order, which is the same on every rank, so every
// backend sees the same sequence of collectives and switches on every member.
//
// The commands, run one at a time in the order enqueued:
//   RunPlan           a set's fused responses, each through the Executor, in order.
//   ChangeSets        an add or remove process set response. It waits for everything enqueued
//                     before it, then runs on the enqueuing thread: it makes channels and
//                     backends, collective over the transport, and nothing may run beside it.
//   SetBackendSwitch  flips a backend switch (autotune's hierarchical allreduce) in the given
//                     sets' backends: between the same two plans on every rank.
// and the two that wait: drain() (everything enqueued has run) and stop().
//
// Where a command runs. With the stream's thread (pipelined rounds, TUTTI_PIPELINE): there,
// while the background thread negotiates the next round; except that a RunPlan of fewer than
// kInlineBytes and a SetBackendSwitch run on the enqueuing thread when the stream is idle
// (nothing queued or running): a small plan takes microseconds, less than the hand-off would
// cost (a lone op's latency). Without the thread (TUTTI_PIPELINE=0, or auto on a small host)
// every command runs on the enqueuing thread at once.
//
// Failures. A command that fails on the stream's thread is fatal: `on_error` gets the error
// (the Runtime makes it sticky, aborts every set and wakes the background thread), nothing
// more runs and the commands left are dropped (their entries stay in the queues, where the
// Runtime's stop fails them). A command run on the enqueuing thread throws there.
//
// Thread contract: enqueue(), drain() and start() are called by one thread, the background
// thread (the constructor's thread before it starts); stop() by the background thread or
// the thread that joins it; idle(), failure(), pendingTensors() and onThread() by any.
#pragma once

#include "core/executor.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

namespace tutti {

struct RunPlan {
  std::shared_ptr<ProcessSet> set;
  std::vector<Response> plan;          // run in order
  int64_t bytes = 0;                   // the plan's data (responseBytes), for the inline rule
  std::shared_ptr<Timeline> timeline;  // null when off
};

struct ChangeSets {
  std::shared_ptr<ProcessSet> set;  // the global set, whose queue holds the request
  Response response;                // kAddProcessSet or kRemoveProcessSet
  std::shared_ptr<Timeline> timeline;
};

struct SetBackendSwitch {
  std::vector<std::shared_ptr<ProcessSet>> sets;  // this rank's member sets
  BackendSwitch which = BackendSwitch::kHierarchicalAllreduce;
  bool on = false;
};

using StreamCommand = std::variant<RunPlan, ChangeSets, SetBackendSwitch>;

class ExecStream {
 public:
  // A plan of fewer bytes runs on the enqueuing thread when the stream idles.
  static constexpr int64_t kInlineBytes = 64 << 10;

  // `change_sets` applies a ChangeSets response to the runtime's set table; `on_error`
  // takes a failure on the stream's thread. Both outlive the stream.
  ExecStream(const Config& config, Stats& stats,
             std::function<void(const Response&)> change_sets,
             std::function<void(const Status&)> on_error)
      : config_(config), executor_(config, stats), change_sets_(std::move(change_sets)),
        on_error_(std::move(on_error)) {}
  ~ExecStream() { stop(); }
  ExecStream(const ExecStream&) = delete;
  ExecStream& operator=(const ExecStream&) = delete;

  // Whether `config` asks for the stream's thread: TUTTI_PIPELINE=1, or auto where every
  // rank of this host can have three cores (the caller's, the background and the stream's).
  static bool wantsThread(const Config& config);
  // Starts the stream's thread (once); before it, every command runs on the enqueuing thread.
  void start();
  bool threaded() const { return threaded_; }
  bool onThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  // Runs `command` after everything enqueued before it (see above for where).
  void enqueue(StreamCommand command);
  // Waits until every command enqueued so far has run. Throws the stream's failure, or a
  // timeout when no command finished for TUTTI_TIMEOUT_SECONDS and a little (a backend past
  // its deadline).
  void drain();
  // Nothing queued or running (then only the enqueuing thread can give it work).
  bool idle() const;
  // The first failure on the stream's thread; OK while none failed.
  Status failure() const;
  // Tensors in plans enqueued and not finished: entries still in the queues that need no
  // more negotiation.
  int64_t pendingTensors() const;
  // Stops the thread after the command it runs; the commands left are dropped. Idempotent.
  void stop();

 private:
  void run(StreamCommand& command);  // the command itself, on whichever thread runs it
  void loop();

  const Config& config_;
  Executor executor_;  // with the fusion buffer: only run() touches it
  std::function<void(const Response&)> change_sets_;
  std::function<void(const Status&)> on_error_;
  bool threaded_ = false;  // start() was called; the enqueuing thread only

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the stream's thread waits for commands
  std::condition_variable done_cv_;  // drain() waits for the queue to empty
  std::vector<StreamCommand> queue_;  // under mu_; front first
  size_t head_ = 0;                   // under mu_: next command to run
  bool running_ = false;              // under mu_: the stream's thread runs a command
  int64_t pending_tensors_ = 0;       // under mu_
  uint64_t finished_ = 0;             // under mu_: commands finished so far
  bool stopping_ = false;             // under mu_
  bool sleeping_ = false;             // under mu_: the stream's thread waits on work_cv_
  std::atomic<uint64_t> pushed_{0};   // commands queued so far (watched without the lock)
  Status failure_;                    // under mu_
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace tutti
