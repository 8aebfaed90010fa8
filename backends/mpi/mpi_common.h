// Pieces shared by the MPI transport, control plane and backend: the per-transport state
// (datatypes and user ops for 16-bit floats, abandoned requests), sticky poison, and the
// deadline wait for non-blocking MPI requests. Internal to backends/mpi.
#pragma once

#include "backends/backend.h"
#include "base/common.h"
#include "base/first_error.h"
#include "base/process_state.h"

#include <mpi.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tutti {
namespace detail {

// Finalizes MPI at process exit if Tutti initialized it (registered with on_exit when MPI is
// initialized, so it runs after the exit hook that shuts the runtime down): MPI cannot be
// initialized twice in a process, and tutti_init must work again after tutti_shutdown.
// After a fatal error (a poisoned group, a request abandoned by a timeout) MPI_Finalize may
// never complete, since a peer may be stopped or stuck: it then runs under a watchdog that
// ends the process without it, with its exit code, after kFinalizeGraceSeconds (for a
// process exiting 0, which caught the error: exit code 1 after the collective deadline), so
// that mpirun ends the whole job.
void finalizeMpiAtExit(int status, void*);
constexpr double kFinalizeGraceSeconds = 3.0;
// Marks the job as failed in this process (the first fatal error, for the exit message).
void markJobFailed(const std::string& why);
// Called when Tutti initializes MPI, with TUTTI_TIMEOUT_SECONDS (how long a process that
// exits 0 after a fatal error waits for MPI_Finalize).
void rememberMpiProcess(double clean_exit_finalize_seconds);

// Objects made once per transport and freed with it. Held through shared_ptr by every
// backend and control plane, so it outlives them. Thread-safe.
class MpiShared {
 public:
  // max_message_elements: the largest count passed to one MPI call (INT_MAX normally;
  // tests lower it to exercise chunking and the overflow checks). Collective over
  // MPI_COMM_WORLD (it duplicates it for the alarm), within start_timeout_seconds.
  MpiShared(int64_t max_message_elements, double start_timeout_seconds);
  ~MpiShared();  // frees ops and types; gives abandoned requests a moment to complete

  MPI_Datatype datatype(DataType dtype) const;
  // The MPI op for (dtype, op): predefined ops, logical or/and for bool, user ops for
  // float16/bfloat16 (computed in float by reduceInto).
  MPI_Op reduceOp(DataType dtype, ReduceOp op) const;
  int64_t maxMessageElements() const { return max_message_elements_; }

  // A request that timed out or was aborted: it may still complete when the late peers
  // arrive, so it is kept and tested once more at shutdown. If any is still pending then,
  // MPI_Finalize at exit is skipped (it would hang on it).
  void abandon(MPI_Request request);

  // Runs a blocking MPI call under a watchdog: MPI cannot cancel a blocking collective, so
  // if `deadline` passes first the watchdog reports `what` on stderr and aborts the job
  // (MPI_Abort), so that no rank hangs. Only for MPI_Comm_create_group (making a process
  // set's communicator), which has no non-blocking form; every op of the data and control
  // planes is non-blocking and waited for with waitRequest. Any thread may call it.
  void runWithWatchdog(Deadline deadline, const std::string& what,
                       const std::function<void()>& call);

  // The job alarm: a fatal error of this process (a timeout, an MPI error, an abort) must
  // reach every other process at once, not after their own deadlines. It rides on a
  // duplicate of MPI_COMM_WORLD that only the alarm uses:
  //   1. every process keeps one MPI_Irecv posted on it (any source, kAlarmTag);
  //   2. raiseAlarm(why) sends "why" to every other world rank with MPI_Isend, once per
  //      transport, unless the failure came from another process's alarm (no echo);
  //   3. every wait loop (through MpiPoison::poisoned) and every op's start tests the
  //      receive: once it has arrived, every group of this transport fails with
  //      "rank S failed: <its reason>".
  // The sends are never waited for (a stopped peer never receives); they are tested once
  // more at shutdown like abandoned requests. Thread-safe.
  void raiseAlarm(const std::string& why);
  // The alarm received from another rank (OK while none arrived); tests the receive.
  Status alarm();
  // The world ranks on this host whose process is stopped or gone (describeStoppedPeers),
  // for the message of a timeout; empty if none.
  std::string stoppedPeers() const;

 private:
  void watch();
  void freeAlarm();
  int64_t max_message_elements_;
  MPI_Datatype two_bytes_ = MPI_DATATYPE_NULL;
  MPI_Op half_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bfloat_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  std::mutex mu_;
  std::vector<MPI_Request> abandoned_;
  // Watchdog of runWithWatchdog (started on first use).
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  uint64_t next_watch_ = 0;
  std::map<uint64_t, std::pair<Deadline, std::string>> armed_;  // calls in progress
  std::thread watchdog_;
  // The alarm (raiseAlarm). alarm_mu_ serializes MPI calls on alarm_recv_ and the sends.
  int world_rank_ = 0, world_size_ = 1;
  MPI_Comm alarm_comm_ = MPI_COMM_NULL;
  std::mutex alarm_mu_;
  MPI_Request alarm_recv_ = MPI_REQUEST_NULL;    // under alarm_mu_
  std::vector<char> alarm_in_;                   // its buffer
  std::string alarm_out_;                        // the text sent, under alarm_mu_
  std::vector<MPI_Request> alarm_sends_;         // under alarm_mu_
  bool alarm_sent_ = false;                      // under alarm_mu_
  FirstError alarm_;                             // the alarm received
  std::vector<PeerProcess> peers_;               // every world rank's host and pid
  std::atomic<int64_t> alarm_tested_{0};         // Clock ticks of the last test
};

// Sticky first error of one group (shared by its control plane and backend). Thread-safe:
// abort() may come from any thread while the background thread waits. The first poison
// of this process raises the job alarm (MpiShared::raiseAlarm); an alarm from another
// rank poisons every group.
class MpiPoison {
 public:
  explicit MpiPoison(std::shared_ptr<MpiShared> shared) : shared_(std::move(shared)) {}
  bool poisoned() {
    if (first_.isSet()) return true;
    Status alarm = shared_->alarm();
    if (alarm.ok()) return false;
    markJobFailed(alarm.message());
    first_.set(alarm.code(), alarm.message());
    return true;
  }
  void throwIfPoisoned() {
    if (poisoned()) first_.throwIfSet();
  }
  // Marks the job failed (see markJobFailed); the first poison sticks.
  void poison(StatusCode code, const std::string& message) {
    markJobFailed(message);
    if (first_.set(code, message)) shared_->raiseAlarm(message);
  }
  // Poisoned only by this process (for destructors: no MPI call).
  bool poisonedHere() const { return first_.isSet(); }

 private:
  std::shared_ptr<MpiShared> shared_;
  FirstError first_;
};

// Throws Error(kBackend, "<where>: <call> failed: <MPI error string>") unless rc is success.
void checkMpi(int rc, const char* call, const std::string& where);

// Names a comm for messages: "rank 3: mpi allreduce on group 2 (world ranks 0, 2)".
struct MpiWhere {
  int world_rank = 0;
  int id = 0;
  const std::vector<int>* ranks = nullptr;
  std::string operator()(const char* op) const;
};

// Waits for `request` until `deadline`: spins ~30 us, then yields, then sleeps with
// back-off up to 200 us, so that oversubscribed ranks do not starve each other. On
// timeout or poison (abort from another thread) it abandons the request, poisons (on
// timeout) and throws.
void waitRequest(MPI_Request& request, Deadline deadline, Clock::time_point start,
                 const std::string& what, MpiPoison& poison, MpiShared& shared);
// The same for every request of an array (completed ones become MPI_REQUEST_NULL).
void waitRequests(MPI_Request* requests, int count, Deadline deadline, Clock::time_point start,
                  const std::string& what, MpiPoison& poison, MpiShared& shared);

// count as int for an MPI call, or Error(kUnsupported) naming the op and the limit.
int checkedCount(int64_t count, int64_t limit, const std::string& what);

// Creates the communicator of `ranks` (sorted world ranks): a dup of MPI_COMM_WORLD for
// the world, else MPI_Comm_create_group with a tag from (id, kind). Collective over the
// members only. Errors are returned, not fatal, on the new communicator.
MPI_Comm makeGroupComm(const std::vector<int>& ranks, int id, int kind, Deadline deadline,
                       const std::string& what, MpiPoison& poison, MpiShared& shared);

}  // namespace detail
}  // namespace tutti
