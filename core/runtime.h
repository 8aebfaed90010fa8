// The Runtime owns everything of one initialized Tutti: the transport, the process sets
// (queues, negotiators, control planes, backends), the execution stream (core/exec_stream.h:
// the executor with its fusion buffer, the only code that touches the backends' data
// plane), the handle table and the background thread. No global state: the C/C++ API holds
// the one Runtime. Public methods are thread-safe.
//
// The background thread runs rounds (core/runtime_round.cc; docs/architecture.md has the
// long form), one at a time under round_mu_; a caller waiting without a timeout on a lone
// op runs them itself while the background thread is in none (helpRounds). One round:
//   1. Wait: not at all when this rank has new work, or the last round had new work
//      anywhere and this rank still has work in flight; otherwise until work is enqueued,
//      or for the idle time (TUTTI_CYCLE_TIME_MS, doubling up to 32x while the job is idle),
//      so that ranks with nothing to do still join rounds others started. A burst of
//      submissions is let finish (coalesceBurst) so that it is negotiated in one round.
//   2. AND-allreduce on the global set of one bit vector: bit 0 "not shutting down"; per
//      process set "no new requests" and "nobody joined"; per set one bit per response
//      cache slot "I hold this cached op" and one "this slot is still valid".
//   3. Cached ops held by every member are ready at once. For each process set, in id
//      order, with new requests (or a joined rank): its members gather their requests at
//      the set's rank 0, which decides (Coordinator) and broadcasts the ordered responses.
//   4. The cache learns the new responses; every member plans fusion over the ready
//      responses (pure, so identical everywhere) and enqueues them on the execution stream
//      in order (add/remove process set responses as ChangeSets, which change the set
//      table; autotune's backend switches, after the AND, as SetBackendSwitch).
//   5. If bit 0 came back 0, every rank stops after one more gather/broadcast on the global
//      set that tells everyone why ("rank 2 left the job (exited with code 7)", "rank 2
//      called shutdown"): open handles fail with a shutdown error naming those ranks.
// A backend error or timeout is fatal: it is recorded (sticky), every open handle fails
// with it, the backends are aborted and the thread exits. So is a tensor that some ranks
// submitted and others did not for TUTTI_TIMEOUT_SECONDS (rank 0 of its set decides, and
// names the ranks that did not arrive), and a tutti_wait without a timeout that outlasts it.
#pragma once

#include "backends/backend.h"
#include "core/autotune.h"
#include "core/config.h"
#include "core/handle_table.h"
#include "core/job_clock.h"
#include "core/exec_stream.h"
#include "core/process_set.h"
#include "core/stats.h"
#include "core/timeline.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace tutti {

class Runtime {
 public:
  // Connects to the job (collective over all ranks) and starts the background thread.
  // Throws Error on a bad setting or a failed connection.
  explicit Runtime(Config config);
  // With a transport made by the caller (unit tests: threads over one loopback hub).
  Runtime(Config config, std::unique_ptr<Transport> transport);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Stops the background thread (telling every rank, with `note` after this rank's number:
  // "called shutdown", "left the job (exited with code 7)") and releases the transport.
  // Idempotent. Called on the background thread itself (from a callback) it only asks the
  // thread to stop after its round; a later shutdown() on another thread joins it.
  void shutdown(const std::string& note = "called shutdown");
  // The background thread, the execution stream's thread, or a caller's thread while it
  // runs a round in wait() (helpRounds): where rounds and callbacks run.
  bool onBackgroundThread() const {
    const std::thread::id me = std::this_thread::get_id();
    return me == thread_id_.load() || me == round_helper_.load() || stream_.onThread();
  }

  const Config& config() const { return config_; }
  const Topology& topology() const { return config_.topology; }
  std::string transportName() const;

  // Validates the `count` entries at `entries` (moved from) and queues them under one
  // handle (grouped when more than one). One tensor needs no list: submit(set, &e, 1, ...).
  Status submit(int process_set, TensorEntry* entries, size_t count, Callback callback,
                Handle* handle);
  Status submit(int process_set, std::vector<TensorEntry> entries, Callback callback,
                Handle* handle) {
    return submit(process_set, entries.data(), entries.size(), std::move(callback), handle);
  }
  Status poll(Handle handle, bool* done);
  // *from_allocator (when not null): whether the output came from the op's allocator.
  Status wait(Handle handle, double timeout_seconds, Result* result, bool* from_allocator = nullptr);

  // Collective over all ranks; blocks until every rank has registered the same set.
  Status addProcessSet(std::vector<int> ranks, int* id);
  Status removeProcessSet(int id);
  std::vector<int> processSetRanks(int id) const;  // empty when unknown
  int processSetRank(int id) const;                // -1 when unknown or not a member

  // Starts writing the timeline for the setting `path` (Timeline::fileFor: a directory
  // gives every rank a file, a file path rank 0 only); stops the one running first unless
  // it writes the same file already. Local to this rank. stopTimeline() lets the round in
  // progress finish its events (up to 1 s), then completes the file.
  Status startTimeline(const std::string& path, bool mark_cycles);
  void stopTimeline();
  // This rank's counters (core/stats.h), sorted by name.
  std::vector<std::pair<std::string, int64_t>> stats() const { return stats_.snapshot(); }
  const JobClock& jobClock() const { return clock_; }

  // The sticky error that stopped the runtime; OK while it runs.
  Status stoppedStatus() const;
  // True once the job failed under this rank: another rank shut down or left, or a fatal
  // error (a timeout, a lost peer); false after this rank's own shutdown.
  bool jobFailed() const { return job_failed_.load(); }

 private:
  std::shared_ptr<ProcessSet> createSet(int id, std::vector<int> ranks);
  void loop();
  void coalesceBurst(std::chrono::duration<double, std::milli> limit);
  bool runRound(bool* had_work);  // false once the job stops
  // runRound with round_mu_ held, by the background thread or a helping caller: an error
  // stops the runtime (stop()). False once no round may run any more (rounds_over_).
  bool runRoundLocked(bool* had_work);
  // A caller waiting (without a timeout of its own) on an op that is not done and is alone
  // in flight on this rank runs this rank's rounds itself while the background thread is
  // not in one, until the op is done or `until`: a lone op then needs no hand-off between
  // two threads, which on a core they share costs more than the op (docs/architecture.md,
  // "Who runs a round").
  void helpRounds(const HandleState& state, Deadline until);
  // Autotune, every kTuneEveryRounds rounds on every rank: rank 0 scores the window that
  // ended and broadcasts the settings; every rank applies them (core/autotune.h).
  static constexpr uint64_t kTuneEveryRounds = 4;
  void tune(ProcessSet& global);
  void logRound(const ProcessSet& set, const std::vector<Response>& plan,
                const std::vector<int64_t>& bytes, size_t cache_hits) const;
  std::string checkStalls(ProcessSet& set);  // root: warns; returns a fatal message if due
  // ChangeSets, run by the stream on the background thread once it has drained.
  void applySetChange(const Response& response);
  // Enqueues `set`'s plan on the stream: each run of ops as one RunPlan, each set change
  // as a ChangeSets. `bytes` are the plan's responses' (responseBytes).
  void enqueuePlan(const std::shared_ptr<ProcessSet>& set, std::vector<Response> plan,
                   const std::vector<int64_t>& bytes, const std::shared_ptr<Timeline>& tl);
  // A failure on the stream's thread: made the sticky error; every set is aborted and the
  // background thread woken, so that it stops at once.
  void streamFailed(const Status& status);
  void stop(const Status& status);
  // From an API thread: makes `status` the sticky error, aborts every control plane and
  // backend and waits (bounded) for the background thread to leave, so that no queued op
  // still points at the caller's buffers once this returns.
  void failJob(const Status& status);
  // Records `status` as the sticky error unless one is already there; returns the sticky one.
  Status recordStop(const Status& status);
  // Aborts every control plane and backend of the sets this rank belongs to (peers fail fast).
  void abortSets(const std::vector<std::shared_ptr<ProcessSet>>& sets, const std::string& why);
  std::string exchangeLeaveNotes(ProcessSet& global, const std::string& mine);
  bool busy() const;
  std::shared_ptr<Timeline> timeline() const;  // null when off: one atomic load
  // Measures the job clock (collective) and logs its largest error on rank 0.
  void syncClock(ProcessSet& global);
  // The settings in force, the topology, and (createSet) each set's backends per op:
  // at info on rank 0 (of the set), at debug on every rank.
  void logStartup() const;
  void logSetBackends(const ProcessSet& set) const;

  Config config_;
  std::unique_ptr<Transport> transport_;
  HandleTable handles_;
  Stats stats_;
  ExecStream stream_;  // the data plane; its thread (TUTTI_PIPELINE) overlaps the rounds
  JobClock clock_;  // measured once at init

  mutable std::mutex timeline_mu_;
  std::shared_ptr<Timeline> timeline_;  // under timeline_mu_; null when off
  std::atomic<bool> timeline_on_{false};
  // Held by whoever runs a round: the background thread, or a caller in helpRounds. Every
  // member below marked "rounds only" is touched under it alone.
  std::mutex round_mu_;
  bool rounds_over_ = false;  // rounds only: the runtime stopped, no round runs any more
  std::atomic<std::thread::id> round_helper_{};  // the caller running a round, if any
  // A set's data plane is on a device (NCCL): its calls set the calling thread's current
  // device, so only the runtime's own threads run rounds (no helping).
  std::atomic<bool> device_plane_{false};
  uint64_t rounds_ = 0;  // rounds only
  // runRound's new requests of a set (popNew), its storage traded with the queues'.
  std::vector<const Request*> fresh_;
  TuneSettings tuned_;   // in force; rounds only (autotune changes it)
  std::unique_ptr<Autotuner> autotuner_;  // rank 0 with TUTTI_AUTOTUNE
  Clock::time_point tune_window_start_;
  int64_t tune_window_bytes_ = 0;

  SetTable sets_;

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  std::atomic<bool> work_pending_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> submissions_{0};     // submit() calls so far
  std::atomic<int64_t> last_submit_{0};      // Clock ticks of the last one
  uint64_t submissions_seen_ = 0;            // background thread only
  // The background thread waits on wake_cv_ (under wake_mu_).
  bool shutdown_requested_ = false;
  std::string leave_note_;             // under wake_mu_: why this rank stops
  bool thread_exited_ = false;         // under wake_mu_; wake_cv_ tells failJob
  // Under wake_mu_: the background thread stepped aside for a caller's rounds (helpRounds)
  // for up to a cycle; the caller clears it when it leaves with ops still in flight.
  bool defers_ = false;
  std::atomic<bool> job_failed_{false};
  // The background thread's id, stored by the thread itself before its first round (its
  // rounds read it; the constructor may not have returned by then).
  std::atomic<std::thread::id> thread_id_{};

  mutable std::mutex status_mu_;
  Status stopped_;  // sticky
  std::atomic<bool> stopped_once_{false};  // stopped_ is set: submit's check without a lock
  std::map<std::string, Clock::time_point> stall_warned_;
  std::thread thread_;
  std::once_flag shutdown_once_;
};

}  // namespace tutti
