#include "core/runtime.h"

#include "backends/registry.h"
#include "base/logging.h"
#include "core/settings_agreement.h"
#include "core/topology.h"
#include "core/validation.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tutti {

Runtime::Runtime(Config config) : Runtime(config, makeTransport(backendOptions(config))) {}

Runtime::Runtime(Config config, std::unique_ptr<Transport> transport)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      stream_(config_, stats_, [this](const Response& r) { applySetChange(r); },
              [this](const Status& s) { streamFailed(s); }),
      tuned_{config_.fusion_threshold, config_.cycle_time_ms, config_.cache_capacity > 0} {
  if (!config_.elastic.id.empty()) {  // an elastic worker's seat, from the rendezvous
    config_.topology.rank = transport_->rank();
    config_.topology.size = transport_->size();
  }
  setLogLevel(config_.log_level);
  setLogTime(!config_.log_hide_time);
  setLogRank(config_.topology.size > 1 ? config_.topology.rank : -1);
  if (transport_->rank() != config_.topology.rank || transport_->size() != config_.topology.size)
    throwError(StatusCode::kInvalidArgument,
               "rank " + std::to_string(config_.topology.rank) + ": the launcher says rank " +
                   std::to_string(config_.topology.rank) + " of " +
                   std::to_string(config_.topology.size) + " but the " + transport_->name() +
                   " transport says rank " + std::to_string(transport_->rank()) + " of " +
                   std::to_string(transport_->size()));
  // A timeline file that cannot be created fails init before any connection is made.
  const std::string timeline_file =
      Timeline::fileFor(config_.timeline_filename, config_.topology.rank);
  if (!timeline_file.empty())
    Timeline::probe(timeline_file, config_.timeline_filename, config_.topology.rank);
  std::vector<int> all(config_.topology.size);
  for (int i = 0; i < config_.topology.size; ++i) all[i] = i;
  auto global = createSet(0, all);
  syncClock(*global);
  // The same on every rank: the registry made the switch as member 0's setting says.
  tuned_.hierarchical = backendSwitch(global->backends, BackendSwitch::kHierarchicalAllreduce);
  Status started = startTimeline(config_.timeline_filename, config_.timeline_mark_cycles);
  if (!started.ok()) throwError(started.code(), started.message());
  if (ExecStream::wantsThread(config_)) stream_.start();
  logStartup();
  thread_ = std::thread([this] { loop(); });
}

Runtime::~Runtime() { shutdown(); }

std::string Runtime::transportName() const { return transport_ ? transport_->name() : ""; }

void Runtime::shutdown(const std::string& note) {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    if (!shutdown_requested_) {
      shutdown_requested_ = true;
      leave_note_ = note;
    }
  }
  wake_cv_.notify_all();
  if (onBackgroundThread()) return;  // a callback: the thread stops after this round
  std::call_once(shutdown_once_, [this] {
    // The thread leaves holding round_mu_ with rounds_over_ set: no caller runs a round
    // after it (helpRounds), so none touches what is released below.
    if (thread_.joinable()) thread_.join();
    handles_.failAll(recordStop(Status(StatusCode::kAborted, "Tutti was shut down")));
    stopTimeline();
    if (config_.print_stats) {
      std::string text = "[tutti rank " + std::to_string(config_.topology.rank) +
                         "] counters at shutdown (TUTTI_STATS=1):\n" + stats_.report();
      std::fwrite(text.data(), 1, text.size(), stderr);
    }
    sets_.clear();
    transport_.reset();
  });
}

Status Runtime::stoppedStatus() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return stopped_;
}

std::shared_ptr<ProcessSet> Runtime::createSet(int id, std::vector<int> ranks) {
  auto set = std::make_shared<ProcessSet>(id, std::move(ranks), config_.topology.rank,
                                          config_.cache_capacity);
  if (set->member()) {
    set->control = transport_->makeControlPlane(set->ranks, id);
    // The global set's control plane is the first channel to every rank: the topology is
    // measured over it before any backend is made (NCCL picks its GPU by local rank).
    // The settings every rank must give alike are compared over it too
    // (core/settings_agreement.h).
    if (id == 0) {
      config_.topology = measureTopology(config_.topology, *set->control,
                                         deadlineAfter(config_.start_timeout_seconds));
      agreeSettings(config_, *set->control, deadlineAfter(config_.start_timeout_seconds));
    }
    set->backends =
        makeBackends(*transport_, *set->control, set->ranks, id, backendOptions(config_));
    for (const auto& b : set->backends)
      if (b->supports(OpType::kAllreduce, DataType::kFloat32, DeviceType::kCuda))
        device_plane_ = true;
    logSetBackends(*set);
  }
  sets_.put(set);
  return set;
}

Status Runtime::submit(int process_set, TensorEntry* entries, size_t count, Callback callback,
                       Handle* handle) {
  if (stopped_once_.load()) return stoppedStatus();
  if (count == 0) return Status(StatusCode::kInvalidArgument, "submit: no tensor to submit");
  auto set = sets_.find(process_set);
  if (!set)
    return Status(StatusCode::kInvalidArgument,
                  std::string(opTypeName(entries[0].request.op)) + " " + quotedName(entries[0].request.name) +
                      ": process set " + std::to_string(process_set) + " does not exist");
  if (!set->member())
    return Status(StatusCode::kInvalidArgument,
                  std::string(opTypeName(entries[0].request.op)) + " " + quotedName(entries[0].request.name) +
                      ": rank " + std::to_string(config_.topology.rank) +
                      " is not a member of process set " + std::to_string(process_set) +
                      " (ranks " + joinInts(set->ranks) + ")");
  try {
    for (size_t i = 0; i < count; ++i) validateEntry(entries[i], set->size());
  } catch (const Error& error) {
    return error.status();
  }
  auto state = handles_.create(static_cast<int>(count), std::move(callback));
  state->op = entries[0].request.op;
  state->name = entries[0].request.name;
  state->tensors = static_cast<int>(count);
  state->process_set = process_set;
  if (count > 1) {
    // The same on every rank: no two groups in flight share a first name.
    const std::string group = entries[0].request.name + "/" + std::to_string(count);
    for (size_t i = 0; i < count; ++i) {
      entries[i].request.group = group;
      entries[i].request.group_size = static_cast<int32_t>(count);
    }
  }
  for (size_t i = 0; i < count; ++i) entries[i].handle = state;
  const bool traced = timeline_on_.load(std::memory_order_relaxed) || logEnabled(LogLevel::kTrace);
  const OpType op = state->op;
  std::shared_ptr<Timeline> tl = traced ? timeline() : nullptr;
  const int64_t submit_us = tl ? tl->now() : 0;  // before the round can see the request
  std::vector<std::string> names;
  Status added = set->queue.add(entries, count, traced ? &names : nullptr);
  if (!added.ok()) {
    handles_.release(state->id);
    return added;
  }
  // A shutdown or fatal error that raced this submission: its failAll may have missed the
  // new handle, and no round will run the entry. Fail it here (idempotent if it did not).
  // The flag is set before failAll takes the table's lock: if this load misses it, the
  // handle was in the table before failAll looked.
  if (stopped_once_.load()) {
    const Status stopped = stoppedStatus();
    HandleTable::fail(*state, stopped);
    handles_.release(state->id);
    return stopped;
  }
  if (traced) {
    if (tl)
      for (const auto& name : names) tl->queued(process_set, op, name, submit_us);
    for (const auto& name : names)
      TUTTI_LOG(kTrace) << "submit " << opTypeName(op) << " " << quotedName(name)
                        << " (process set " << process_set << ", handle " << state->id << ")";
  }
  submissions_.fetch_add(1);
  last_submit_.store(Clock::now().time_since_epoch().count());
  // The background thread is woken (a futex call) only when it sleeps: a burst of
  // submissions while it runs or watches costs no system call.
  if (!work_pending_.exchange(true) && sleeping_.load()) {  // seq_cst: pairs with loop()
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_cv_.notify_one();
  }
  *handle = state->id;
  return Status::OK();
}

Status Runtime::poll(Handle handle, bool* done) {
  auto state = handles_.find(handle);
  if (!state) return Status(StatusCode::kInvalidArgument, "unknown handle " + std::to_string(handle));
  *done = state->done.load(std::memory_order_acquire);
  return Status::OK();
}

Status Runtime::wait(Handle handle, double timeout_seconds, Result* result, bool* from_allocator) {
  bool released = false;  // an op found done is released at once, under the same lock
  auto state = handles_.findForWait(handle, &released);
  if (!state) return Status(StatusCode::kInvalidArgument, "unknown handle " + std::to_string(handle));
  // Without a timeout of its own a wait ends at the job's deadline. Rank 0 of the set turns a
  // tensor that waited that long into a fatal error on every rank naming the ranks that did
  // not arrive; the grace lets that verdict arrive first.
  const bool job_deadline = timeout_seconds < 0;
  constexpr double kVerdictGrace = 3.0;
  const double limit = job_deadline ? config_.timeout_seconds + kVerdictGrace : timeout_seconds;
  const Deadline until = deadlineAfter(limit);
  if (job_deadline && !released) helpRounds(*state, until);
  Status status = released ? state->status : HandleTable::wait(*state, until);
  if (status.code() == StatusCode::kInProgress) {
    if (!job_deadline) return status;  // the op stays queued and owned by the runtime
    // No verdict (rank 0 unreachable, say): the job cannot go on. Stop it, so that the op
    // no longer holds the caller's buffers once this returns.
    failJob(Status(StatusCode::kTimeout,
                   "rank " + std::to_string(config_.topology.rank) + ": " + state->what() +
                       " (handle " + std::to_string(handle) + ") not finished after " +
                       "TUTTI_TIMEOUT_SECONDS=" + secondsText(config_.timeout_seconds) +
                       "; the job is stopped"));
    status = HandleTable::wait(*state, deadlineAfter(0));
    if (status.code() == StatusCode::kInProgress) status = stoppedStatus();
  }
  if (!HandleTable::claim(*state, result, from_allocator))  // another thread waited on it alongside
    return Status(StatusCode::kInvalidArgument,
                  "handle " + std::to_string(handle) + " was already waited on by another thread");
  if (!released) handles_.release(handle);
  return status;
}

Status Runtime::recordStop(const Status& status) {
  std::lock_guard<std::mutex> lock(status_mu_);
  if (stopped_.ok()) stopped_ = status;
  stopped_once_ = !stopped_.ok();
  return stopped_;
}

void Runtime::abortSets(const std::vector<std::shared_ptr<ProcessSet>>& sets,
                        const std::string& why) {
  for (auto& set : sets) {
    if (!set->member()) continue;
    set->control->abort(why);
    for (auto& b : set->backends) b->abort(why);
  }
}

void Runtime::failJob(const Status& status) {
  recordStop(status);
  job_failed_ = true;
  TUTTI_LOG(kError) << status.message();
  abortSets(sets_.all(), status.message());
  std::unique_lock<std::mutex> lock(wake_mu_);
  wake_cv_.notify_all();
  if (onBackgroundThread()) return;  // a callback: the thread stops when it returns
  // Returns only once the background thread (which joins the executor thread first) has
  // let go of every queued entry, so that no backend call writes into a buffer that the
  // caller gets back. The aborts end every backend wait within one poll; a call that
  // ignores them still ends at its own deadline (TUTTI_TIMEOUT_SECONDS). If even that
  // passes, the buffers can never be handed back safely: the process is ended instead.
  auto exited = [this] { return thread_exited_; };
  if (wake_cv_.wait_for(lock, std::chrono::seconds(10), exited)) return;
  TUTTI_LOG(kError) << "the background thread is still in a backend call 10 s after the "
                       "abort; waiting for it (at most TUTTI_TIMEOUT_SECONDS=" +
                           secondsText(config_.timeout_seconds) + " more)";
  if (wake_cv_.wait_for(lock, std::chrono::duration<double>(config_.timeout_seconds + 5.0),
                        exited))
    return;
  std::fprintf(stderr, "tutti: rank %d: the background thread never left its backend call "
                       "after the abort, so the buffers of the ops in flight cannot be handed "
                       "back; the process is ended (exit code 1)\n", config_.topology.rank);
  std::fflush(nullptr);
  std::_Exit(1);
}

Status Runtime::addProcessSet(std::vector<int> ranks, int* id) {
  const std::string wrong = checkGroupRanks(ranks, config_.topology.size);
  if (!wrong.empty()) return Status(StatusCode::kInvalidArgument, "add_process_set: " + wrong);
  TensorEntry e;
  e.request.op = OpType::kAddProcessSet;
  e.request.splits.assign(ranks.begin(), ranks.end());
  Handle handle = 0;
  Status s = submit(0, &e, 1, nullptr, &handle);
  if (!s.ok()) return s;
  auto state = handles_.find(handle);
  s = wait(handle, -1, nullptr);
  if (s.ok()) *id = state->value;
  return s;
}

Status Runtime::removeProcessSet(int id) {
  if (id == 0) return Status(StatusCode::kInvalidArgument, "remove_process_set: the global process set 0 cannot be removed");
  if (!sets_.find(id)) return Status(StatusCode::kInvalidArgument, "remove_process_set: process set " + std::to_string(id) + " does not exist");
  TensorEntry e;
  e.request.op = OpType::kRemoveProcessSet;
  e.request.root = id;
  Handle handle = 0;
  Status s = submit(0, &e, 1, nullptr, &handle);
  return s.ok() ? wait(handle, -1, nullptr) : s;
}

std::vector<int> Runtime::processSetRanks(int id) const {
  auto set = sets_.find(id);
  return set ? set->ranks : std::vector<int>();
}

int Runtime::processSetRank(int id) const {
  auto set = sets_.find(id);
  return set ? set->rank : -1;
}

bool Runtime::busy() const {
  // Entries of plans the stream's thread has yet to run need no more rounds.
  return sets_.inFlight() > stream_.pendingTensors();
}

void Runtime::streamFailed(const Status& status) {
  recordStop(status);
  job_failed_ = true;
  abortSets(sets_.all(), status.message());
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    work_pending_ = true;  // the background thread runs a round at once: it fails and stops
  }
  wake_cv_.notify_all();
}

void Runtime::loop() {
  thread_id_.store(std::this_thread::get_id());
  struct Exited {  // tells failJob the thread no longer touches queued entries
    Runtime* self;
    ~Exited() {
      std::lock_guard<std::mutex> lock(self->wake_mu_);
      self->thread_exited_ = true;
      self->wake_cv_.notify_all();
    }
  } exited{this};
  // Sleeps in the backends' wait loops are short; the default 50 us timer slack would
  // stretch every one of them.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  auto cycle = [this] {  // autotune may change it between rounds (read under round_mu_)
    return std::chrono::duration<double, std::milli>(std::max(tuned_.cycle_time_ms, 0.05));
  };
  std::unique_lock<std::mutex> first_round(round_mu_);
  auto base = cycle();
  first_round.unlock();
  auto idle = base;
  bool had_work = false;
  while (true) {
    if (had_work) {
      // Right after work the next op is often microseconds away (a training step's next
      // gradient, a latency loop): watch for it a little before paying for a futex sleep.
      auto until = Clock::now() + std::chrono::microseconds(50);
      while (!work_pending_.load(std::memory_order_acquire) && Clock::now() < until)
        std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      const bool in_flight = busy();
      if (!work_pending_ && !shutdown_requested_ && !(had_work && in_flight)) {
        auto wait_for = in_flight ? base : idle;
        sleeping_ = true;
        wake_cv_.wait_for(lock, wait_for, [this] { return work_pending_ || shutdown_requested_; });
        sleeping_ = false;
      }
      work_pending_ = false;
    }
    coalesceBurst(base);
    std::unique_lock<std::mutex> round(round_mu_, std::try_to_lock);
    if (!round.owns_lock()) {
      // A caller waiting on its op runs the rounds (helpRounds): let it rather than take
      // the next round from under it, and come back after a cycle (submissions meanwhile
      // do not wake this thread: it is not marked sleeping). To stop, wait for its round.
      had_work = false;
      std::unique_lock<std::mutex> lock(wake_mu_);
      defers_ = true;
      wake_cv_.wait_for(lock, base, [this] { return shutdown_requested_ || !defers_; });
      defers_ = false;
      if (!shutdown_requested_) continue;
      lock.unlock();
      round.lock();
    }
    if (!runRoundLocked(&had_work)) return;
    if (cycle() != base) idle = base = cycle();
    idle = had_work ? base : std::min(idle * 2, base * 32);
  }
}

bool Runtime::runRoundLocked(bool* had_work) {
  if (rounds_over_) return false;
  try {
    if (runRound(had_work)) return true;
  } catch (const Error& error) {
    stop(error.status());
  } catch (const std::exception& error) {
    stop(Status(StatusCode::kInternal, error.what()));
  }
  rounds_over_ = true;
  return false;
}

void Runtime::helpRounds(const HandleState& state, Deadline until) {
  // Not where rounds run already (a callback that waits), nor on a device's data plane.
  if (onBackgroundThread() || device_plane_.load(std::memory_order_relaxed)) return;
  // Only for an op alone in flight on this rank: with others (a training step's gradients)
  // the background thread is negotiating them already, and taking turns with it costs a
  // hand-off per wait.
  if (sets_.inFlight() > state.tensors) return;
  bool helped = false;
  while (!state.done.load(std::memory_order_acquire) && Clock::now() < until) {
    std::unique_lock<std::mutex> round(round_mu_, std::try_to_lock);
    if (!round.owns_lock()) break;  // the background thread runs one: wait for the op
    helped = true;
    work_pending_.store(false);  // this round takes what was submitted so far
    round_helper_.store(std::this_thread::get_id());
    bool had_work = false;
    const bool go_on = runRoundLocked(&had_work);
    round_helper_.store(std::thread::id());
    if (!go_on) {  // stopped: the background thread sees rounds_over_ and exits
      {
        std::lock_guard<std::mutex> lock(wake_mu_);
        work_pending_ = true;
        defers_ = false;
      }
      wake_cv_.notify_all();
      return;
    }
  }
  // Ops still in flight (another thread's) are the background thread's again: if it
  // stepped aside for this caller's rounds, it comes back now rather than after a cycle.
  if (!helped || !busy()) return;
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (!defers_) return;
  defers_ = false;
  wake_cv_.notify_all();
}

void Runtime::coalesceBurst(std::chrono::duration<double, std::milli> limit) {
  // A lone op (one submission since the last round) starts its round at once. A burst
  // (a backward pass, a step's worth of gradients) is let finish first, up to the cycle
  // time, so that it is negotiated and fused in one round rather than in many small ones.
  const uint64_t submitted = submissions_.load();
  const bool burst = submitted - submissions_seen_ >= 2;
  submissions_seen_ = submitted;
  if (!burst) return;
  const auto start = Clock::now();
  const auto quiet = std::chrono::microseconds(10);
  for (;;) {
    const auto now = Clock::now();
    if (now - start >= limit || now.time_since_epoch().count() - last_submit_.load() >=
                                    std::chrono::duration_cast<Clock::duration>(quiet).count())
      break;
    std::this_thread::yield();
  }
  submissions_seen_ = submissions_.load();
}

void Runtime::applySetChange(const Response& response) {
  auto global = sets_.find(0);
  auto entry = global->queue.take(response.names[0]);
  Status status;
  if (response.type == ResponseType::kError) {
    status = Status(response.error_code, response.error_message);
  } else if (response.op == OpType::kAddProcessSet) {
    int id = sets_.nextId();
    auto set = createSet(id, std::vector<int>(response.splits.begin(), response.splits.end()));
    // A new set starts with the switch autotune chose (the same on every rank): the stream
    // has drained, and this set has run nothing yet.
    if (set->member() && tuned_.hierarchical >= 0)
      setBackendSwitch(set->backends, BackendSwitch::kHierarchicalAllreduce,
                       tuned_.hierarchical == 1);
    if (entry) entry->handle->value = id;
  } else {
    std::shared_ptr<ProcessSet> removed = sets_.remove(response.value);
    if (removed) removed->negotiator.forget();  // it points into the entries failed below
    if (removed)
      for (auto& e : removed->queue.takeAll())
        HandleTable::complete(*e.handle, Status(StatusCode::kAborted,
                                                "process set " + std::to_string(removed->id) + " was removed"));
  }
  if (entry) HandleTable::complete(*entry->handle, status);
}

void Runtime::stop(const Status& status) {
  if (auto tl = timeline()) tl->flush();  // the file shows what ran up to the failure
  // The sticky error: failJob may have set one before the thread noticed.
  const Status first = recordStop(status);
  if (first.code() != StatusCode::kAborted) job_failed_ = true;
  if (first.code() != StatusCode::kAborted && status.code() != StatusCode::kAborted)
    TUTTI_LOG(kError) << "background thread stopped: " << first.message();
  const auto sets = sets_.all();
  if (first.code() != StatusCode::kAborted) abortSets(sets, first.message());
  // The stream's thread lets go of the queued entries (its command in progress fails fast
  // on the aborted backends) before they are failed here.
  stream_.stop();
  for (auto& set : sets)
    for (auto& e : set->queue.takeAll()) HandleTable::fail(*e.handle, first);
  handles_.failAll(first);
}

}  // namespace tutti
