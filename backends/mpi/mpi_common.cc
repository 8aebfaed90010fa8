#include "backends/mpi/mpi_common.h"

#include "base/process_state.h"
#include "base/reduce.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tutti {
namespace detail {
namespace {

// MPI user op: inout[i] = in[i] (op) inout[i], computed in float by the shared kernel.
template <DataType D, ReduceOp O>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduceInto(inout, in, *len, D, O);
}

using UserFunction = void (*)(void*, void*, int*, MPI_Datatype*);

template <DataType D>
void makeOps(MPI_Op (&ops)[4]) {
  const UserFunction functions[4] = {reduce16<D, ReduceOp::kSum>, reduce16<D, ReduceOp::kMin>,
                                     reduce16<D, ReduceOp::kMax>,
                                     reduce16<D, ReduceOp::kProduct>};
  for (int i = 0; i < 4; ++i)
    checkMpi(MPI_Op_create(functions[i], /*commute=*/1, &ops[i]), "MPI_Op_create",
             "mpi transport");
}

int opIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return 0;
    case ReduceOp::kMin: return 1;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kProduct: return 3;
    case ReduceOp::kAverage: break;
  }
  throwError(StatusCode::kInvalidArgument,
             "mpi backend: reduce op average must be turned into sum + scale by the core");
}

}  // namespace

std::atomic<bool> g_job_failed{false};
std::mutex g_failed_mu;
std::string g_failed_why;  // under g_failed_mu
pid_t g_mpi_pid = 0;        // the process that initialized MPI (not a forked child)
std::atomic<double> g_clean_exit_finalize_seconds{1800.0};  // TUTTI_TIMEOUT_SECONDS

void markJobFailed(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_failed_mu);
  if (g_job_failed.exchange(true)) return;
  g_failed_why = why;
}

// The alarm's text is cut to this many bytes (one eager message).
constexpr int kAlarmBytes = 1024;
constexpr int kAlarmTag = 7;
// How often a wait loop tests the alarm's receive (it also drives MPI's progress anyway).
constexpr auto kAlarmPoll = std::chrono::microseconds(200);
constexpr int kProcessBytes = 256;  // describeThisProcess(), cut

MpiShared::MpiShared(int64_t max_message_elements, double start_timeout_seconds)
    : max_message_elements_(max_message_elements) {
  checkMpi(MPI_Type_contiguous(2, MPI_BYTE, &two_bytes_), "MPI_Type_contiguous",
           "mpi transport");
  checkMpi(MPI_Type_commit(&two_bytes_), "MPI_Type_commit", "mpi transport");
  makeOps<DataType::kFloat16>(half_ops_);
  makeOps<DataType::kBFloat16>(bfloat_ops_);
  checkMpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", "mpi transport");
  checkMpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size", "mpi transport");
  if (world_size_ == 1) return;
  const std::string what = "rank " + std::to_string(world_rank_) +
                           ": mpi transport: creating the alarm communicator";
  // A wait of its own: no alarm exists yet to raise or to test.
  const Deadline deadline = deadlineAfter(start_timeout_seconds);
  auto wait = [&](MPI_Request& request) {
    for (int done = 0;;) {
      checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
      if (done) return;
      if (Clock::now() >= deadline) {
        abandon(request);
        throwError(StatusCode::kTimeout, what + ": the other ranks did not join within " +
                                             secondsText(start_timeout_seconds) + " s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  MPI_Request request = MPI_REQUEST_NULL;
  checkMpi(MPI_Comm_idup(MPI_COMM_WORLD, &alarm_comm_, &request), "MPI_Comm_idup", what);
  wait(request);
  // Every rank's host and pid, so that a timeout can name a stopped process on this host.
  std::vector<char> mine(kProcessBytes, '\0'), all(kProcessBytes * world_size_, '\0');
  const std::string me = describeThisProcess().substr(0, kProcessBytes - 1);
  std::copy(me.begin(), me.end(), mine.begin());
  checkMpi(MPI_Iallgather(mine.data(), kProcessBytes, MPI_CHAR, all.data(), kProcessBytes,
                          MPI_CHAR, alarm_comm_, &request),
           "MPI_Iallgather", what);
  wait(request);
  for (int r = 0; r < world_size_; ++r) {
    const char* text = &all[static_cast<size_t>(r) * kProcessBytes];
    peers_.push_back(parsePeerProcess(std::string(text, strnlen(text, kProcessBytes))));
  }
  checkMpi(MPI_Comm_set_errhandler(alarm_comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
           what);
  alarm_in_.assign(kAlarmBytes, '\0');
  checkMpi(MPI_Irecv(alarm_in_.data(), kAlarmBytes, MPI_CHAR, MPI_ANY_SOURCE, kAlarmTag,
                     alarm_comm_, &alarm_recv_),
           "MPI_Irecv", what);
}

void MpiShared::raiseAlarm(const std::string& why) {
  if (alarm_comm_ == MPI_COMM_NULL || alarm_.isSet()) return;  // alone, or not the origin
  std::lock_guard<std::mutex> lock(alarm_mu_);
  if (alarm_sent_) return;
  alarm_sent_ = true;
  alarm_out_ = why.substr(0, kAlarmBytes);
  for (int r = 0; r < world_size_; ++r) {
    if (r == world_rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // A failed send leaves that peer to its own deadline; the local error is thrown anyway.
    if (MPI_Isend(alarm_out_.data(), static_cast<int>(alarm_out_.size()), MPI_CHAR, r,
                  kAlarmTag, alarm_comm_, &request) == MPI_SUCCESS)
      alarm_sends_.push_back(request);
  }
}

Status MpiShared::alarm() {
  if (alarm_.isSet()) return alarm_.status();
  if (alarm_comm_ == MPI_COMM_NULL) return Status::OK();
  const int64_t now = Clock::now().time_since_epoch().count();
  if (now - alarm_tested_.load(std::memory_order_relaxed) <
      std::chrono::duration_cast<Clock::duration>(kAlarmPoll).count())
    return Status::OK();
  alarm_tested_.store(now, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(alarm_mu_, std::try_to_lock);
  if (!lock.owns_lock() || alarm_recv_ == MPI_REQUEST_NULL) return alarm_.status();
  int done = 0;
  MPI_Status status;
  if (MPI_Test(&alarm_recv_, &done, &status) != MPI_SUCCESS || !done) return Status::OK();
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  length = std::max(0, std::min(length, kAlarmBytes));  // never trust the peer's bytes
  std::string text(alarm_in_.data(), static_cast<size_t>(length));
  for (char& c : text)
    if (c < 32 || c > 126) c = '?';
  const int source = status.MPI_SOURCE;
  alarm_.set(StatusCode::kAborted, "rank " + std::to_string(source) +
                                       " failed and stopped the job (its error: " + text + ")");
  return alarm_.status();
}

std::string MpiShared::stoppedPeers() const { return describeStoppedPeers(peers_, world_rank_); }

void MpiShared::freeAlarm() {
  if (alarm_comm_ == MPI_COMM_NULL) return;
  std::lock_guard<std::mutex> lock(alarm_mu_);
  if (alarm_recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&alarm_recv_);
    MPI_Wait(&alarm_recv_, MPI_STATUS_IGNORE);  // local once cancelled (or received)
  }
  // The sends reach peers that are alive; a stopped one keeps its send pending.
  const Deadline grace = deadlineAfter(1.0);
  bool pending = false;
  for (MPI_Request& request : alarm_sends_) {
    int done = 0;
    while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
           Clock::now() < grace)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    pending = pending || !done;
  }
  if (!pending) MPI_Comm_free(&alarm_comm_);
}

void MpiShared::runWithWatchdog(Deadline deadline, const std::string& what,
                                const std::function<void()>& call) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
    id = next_watch_++;
    armed_[id] = {deadline, what};
  }
  watch_cv_.notify_all();
  struct Disarm {
    MpiShared* self;
    uint64_t id;
    ~Disarm() {
      std::lock_guard<std::mutex> lock(self->watch_mu_);
      self->armed_.erase(id);
    }
  } disarm{this, id};
  call();
}

void MpiShared::watch() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    if (armed_.empty()) {
      watch_cv_.wait(lock);
      continue;
    }
    auto first = armed_.begin();
    for (auto it = armed_.begin(); it != armed_.end(); ++it)
      if (it->second.first < first->second.first) first = it;
    if (Clock::now() < first->second.first) {
      // A copy: the call may finish and erase its entry while this thread waits.
      const Deadline until = first->second.first;
      watch_cv_.wait_until(lock, until);
      continue;  // re-examine: calls may have finished or started meanwhile
    }
    std::fprintf(stderr, "%s: timed out; a blocking MPI call cannot be cancelled, so the job "
                         "is aborted (MPI_Abort)\n", first->second.second.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 124);
  }
}

MpiShared::~MpiShared() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  freeAlarm();
  for (MPI_Op* ops : {half_ops_, bfloat_ops_})
    for (int i = 0; i < 4; ++i)
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
  if (two_bytes_ != MPI_DATATYPE_NULL) MPI_Type_free(&two_bytes_);
  // MPI stays up until the process exits (finalizeMpiAtExit), also for a transport made
  // after MPI was initialized by an earlier one. A request abandoned by a timeout may have
  // completed since (the late peer arrived); give the stragglers a moment, and skip
  // MPI_Finalize at exit if one is still pending.
  std::lock_guard<std::mutex> lock(mu_);
  Deadline grace = deadlineAfter(1.0);
  for (MPI_Request& request : abandoned_) {
    int done = 0;
    while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
           Clock::now() < grace)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (!done) markJobFailed("an MPI request abandoned by a timeout never completed");
  }
}

void finalizeMpiAtExit(int status, void*) {
  if (g_mpi_pid != 0 && getpid() != g_mpi_pid) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  if (!g_job_failed) {
    MPI_Finalize();
    return;
  }
  // The peers may never reach MPI_Finalize (stopped, stuck in a collective): give it a
  // moment, then end the whole job with this process's code. A process that caught the
  // error and exits 0 waits as long as for any collective: the peers may still be busy (a
  // stall that was reported and handled) and a handled error must not fail the job.
  const int code = status != 0 ? status : 1;
  const double grace = status != 0 ? kFinalizeGraceSeconds : g_clean_exit_finalize_seconds.load();
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::thread([code, rank, grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    std::string why;
    {
      std::lock_guard<std::mutex> lock(g_failed_mu);
      why = g_failed_why;
    }
    std::fprintf(stderr, "tutti: rank %d: exiting after a fatal error (%s); MPI_Finalize did not "
                 "complete within %.0f s, so the process exits with code %d without it (the "
                 "launcher then ends the job)\n",
                 rank, why.c_str(), grace, code);
    std::fflush(stderr);
    // Not MPI_Abort: mpiexec 4.1's abort path, with a peer stopped or stuck, was seen to hang
    // or crash in PMIx_server_finalize; a process that leaves without finalizing is the
    // launcher's everyday failure, which ends the job with this code.
    std::_Exit(code);
  }).detach();
  MPI_Finalize();
}

void rememberMpiProcess(double clean_exit_finalize_seconds) {
  g_mpi_pid = getpid();
  g_clean_exit_finalize_seconds = clean_exit_finalize_seconds;
}

MPI_Datatype MpiShared::datatype(DataType dtype) const {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16:
    case DataType::kBFloat16: return two_bytes_;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_UINT8_T;  // 0/1 bytes; reduced with MPI_LOR / MPI_LAND
  }
  throwError(StatusCode::kInvalidArgument,
             "mpi backend: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

MPI_Op MpiShared::reduceOp(DataType dtype, ReduceOp op) const {
  int index = opIndex(op);
  if (dtype == DataType::kFloat16) return half_ops_[index];
  if (dtype == DataType::kBFloat16) return bfloat_ops_[index];
  if (dtype == DataType::kBool) return (index == 0 || index == 2) ? MPI_LOR : MPI_LAND;
  const MPI_Op predefined[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return predefined[index];
}

void MpiShared::abandon(MPI_Request request) {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_.push_back(request);
}

void checkMpi(int rc, const char* call, const std::string& where) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throwError(StatusCode::kBackend, where + ": " + call + " failed with error " +
                                       std::to_string(rc) + ": " + std::string(text, length));
}

std::string MpiWhere::operator()(const char* op) const {
  std::string members = ranks->size() <= 16 ? "world ranks " + joinInts(*ranks)
                                             : std::to_string(ranks->size()) + " ranks";
  return "rank " + std::to_string(world_rank) + ": mpi " + op + " on group " +
         std::to_string(id) + " (" + members + ")";
}

void waitRequests(MPI_Request* requests, int count, Deadline deadline, Clock::time_point start,
                  const std::string& what, MpiPoison& poison, MpiShared& shared) {
  using std::chrono::microseconds;
  auto abandonAll = [&] {
    for (int i = 0; i < count; ++i)
      if (requests[i] != MPI_REQUEST_NULL) shared.abandon(requests[i]);
  };
  const auto waiting_since = Clock::now();
  microseconds nap(5);
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      abandonAll();
      checkMpi(rc, "MPI_Testall", what);
    }
    if (done) return;
    if (poison.poisoned()) {
      abandonAll();
      poison.throwIfPoisoned();
    }
    auto now = Clock::now();
    if (now >= deadline) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f",
                    std::chrono::duration<double>(deadline - start).count());
      abandonAll();
      const std::string stopped = shared.stoppedPeers();
      poison.poison(StatusCode::kTimeout, what + ": timed out after " + seconds +
                                              " s waiting for the other members" +
                                              (stopped.empty() ? "" : "; " + stopped));
      poison.throwIfPoisoned();
    }
    // Spin, then yield (ranks may share cores), then nap: briefly, since a long nap turns
    // into a fixed tax on every op once peers fall into step with it. Naps grow only after
    // a long wait (a peer computing), to at most 100 us.
    auto waited = now - waiting_since;
    if (waited < microseconds(30)) continue;
    if (waited < microseconds(2000)) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    if (waited > std::chrono::milliseconds(20)) nap = std::min(nap * 2, microseconds(100));
  }
}

void waitRequest(MPI_Request& request, Deadline deadline, Clock::time_point start,
                 const std::string& what, MpiPoison& poison, MpiShared& shared) {
  waitRequests(&request, 1, deadline, start, what, poison, shared);
}

int checkedCount(int64_t count, int64_t limit, const std::string& what) {
  if (count < 0)
    throwError(StatusCode::kInvalidArgument, what + ": count must be >= 0, got " +
                                                 std::to_string(count));
  if (count > limit)
    throwError(StatusCode::kUnsupported,
               what + ": " + std::to_string(count) + " elements (or element offset) exceed " +
                   "the largest count one MPI call takes (" + std::to_string(limit) + ")");
  return static_cast<int>(count);
}

MPI_Comm makeGroupComm(const std::vector<int>& ranks, int id, int kind, Deadline deadline,
                       const std::string& what, MpiPoison& poison, MpiShared& shared) {
  int world_size = 0;
  checkMpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size", what);
  MPI_Comm comm = MPI_COMM_NULL;
  if (static_cast<int>(ranks.size()) == world_size) {
    MPI_Request request = MPI_REQUEST_NULL;
    checkMpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup", what);
    waitRequest(request, deadline, Clock::now(), what, poison, shared);
  } else {
    int* tag_ub = nullptr;
    int found = 0;
    checkMpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found),
             "MPI_Comm_get_attr(MPI_TAG_UB)", what);
    int64_t ub = (found && tag_ub) ? *tag_ub : 32767;
    int tag = static_cast<int>((static_cast<int64_t>(id < 0 ? -id : id) * 2 + kind) % (ub + 1));
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    checkMpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group", what);
    int rc = MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
    MPI_Group_free(&world_group);
    checkMpi(rc, "MPI_Group_incl", what);
    // No non-blocking form: the watchdog bounds it (the members reach it right after
    // agreeing on the process set, so it normally returns at once).
    shared.runWithWatchdog(deadline, what, [&] {
      rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
    });
    MPI_Group_free(&group);
    checkMpi(rc, "MPI_Comm_create_group", what);
  }
  checkMpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", what);
  return comm;
}

}  // namespace detail
}  // namespace tutti
