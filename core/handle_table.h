// Handles: what the caller waits on. Thread-safe: created by API threads, completed by the
// background thread, waited on/polled/released by API threads.
//
// A handle's `done` flag is an atomic set once its status and result are final: a poll or
// wait that finds it set reads them without a lock or a system call. A waiter that must
// sleep does so on the table's one condition variable; completing a handle wakes it only
// when someone sleeps there, and the executor completes a fused batch's handles first and
// wakes the sleepers once (wake()).
#pragma once

#include "base/common.h"
#include "core/block_pool.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace tutti {

class HandleTable;

struct HandleState {
  std::mutex mu;                  // remaining, status and callback until done
  std::atomic<bool> done{false};  // set once status and result no longer change
  int remaining = 1;  // parts still running (grouped allreduce has one per tensor)
  Status status;      // the first error of any part
  Result result;
  Callback callback;
  Handle id = 0;
  int value = -1;  // add_process_set: the new id
  bool claimed = false;  // under mu: a waiter has taken the status and result (claim())
  bool from_allocator = false;  // result.data came from the op's allocator (not malloc)
  // What the handle runs, for errors (built only when one is reported: submit is hot).
  OpType op = OpType::kAllreduce;
  std::string name;  // of the first tensor
  int tensors = 1;
  int process_set = 0;
  std::string what() const;  // "allreduce 'grad.w' (process set 0)"
  HandleTable* owner = nullptr;
};

class HandleTable {
 public:
  // A new handle that completes after `parts` calls of complete().
  std::shared_ptr<HandleState> create(int parts, Callback callback);
  std::shared_ptr<HandleState> find(Handle handle);
  // find(), and when the handle is done already also release() it, under one lock (the
  // usual wait: its op finished while the caller did other work). *released says which.
  std::shared_ptr<HandleState> findForWait(Handle handle, bool* released);
  void release(Handle handle);

  // Completes one part. The handle is done once every part has completed; then waiters wake
  // (unless `wake` is false: the caller calls wake() once for a batch) and the callback runs
  // (on the calling thread). A handle with a callback may never be waited on: once its
  // callback has run it stays known (poll, wait) until it is waited on or kKeepCalledBack
  // later callback handles have completed, then it is released.
  static void complete(HandleState& state, const Status& status, bool wake = true);
  static constexpr size_t kKeepCalledBack = 4096;
  // Wakes the waiters asleep in wait() (no system call when there are none).
  void wake();

  // Waits until done or the deadline. kInProgress if not done in time, else the op's status.
  static Status wait(HandleState& state, Deadline deadline);

  // The one waiter of a done handle: true, and its result moved into *result (when not
  // null), for the first caller only. Two threads may wait on one handle; only one of them
  // gets the op (and owns its output), the other is told the handle was waited on.
  // *from_allocator (when not null): whether the output came from the op's allocator.
  static bool claim(HandleState& state, Result* result, bool* from_allocator = nullptr);

  // Completes every part of the handle with `status` (shutdown, fatal error), its message
  // prefixed with the handle's op, tensor and process set unless it names them already.
  static void fail(HandleState& state, const Status& status);

  // fail() for every open handle.
  void failAll(const Status& status);

 private:
  void retire(Handle handle);  // a handle whose callback ran
  Status sleepUntilDone(HandleState& state, Deadline deadline);

  std::mutex mu_;
  Handle next_ = 1;
  std::deque<Handle> called_back_;  // oldest first
  using Map = std::unordered_map<Handle, std::shared_ptr<HandleState>>;
  Map handles_;
  // Pooled: the handles' memory and the map's nodes of released handles are reused by the
  // next ones (kPooled of each at most).
  static constexpr size_t kPooled = 4096;
  std::shared_ptr<BlockPool> pool_ = std::make_shared<BlockPool>(kPooled);
  SpareNodes<Map> nodes_{kPooled};  // under mu_: erase with nodes_.take(handles_, it)

  // The sleepers of wait(): they count themselves in sleepers_ (under sleep_mu_) before
  // they check `done` a last time, and complete() sets `done` before it reads sleepers_
  // (both sequentially consistent), so that either the sleeper sees its handle done or
  // the completer sees the sleeper and notifies under sleep_mu_.
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace tutti
