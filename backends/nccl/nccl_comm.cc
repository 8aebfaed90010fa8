#include "backends/nccl/nccl_comm.h"

#include "backends/nccl/nccl_types.h"

#include <cstdio>
#include <cstring>
#include <thread>

namespace tutti {
namespace detail {

namespace {

// Spins (yielding) for the first 200 us, as small GPU ops finish in tens of microseconds,
// then sleeps with exponential backoff from 10 us up to 1 ms.
class Backoff {
 public:
  void pause() {
    auto waited = Clock::now() - start_;
    if (waited < std::chrono::microseconds(200)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    if (sleep_ < std::chrono::microseconds(1000)) sleep_ *= 2;
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{10};
};

std::string seconds(Clock::duration elapsed) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(elapsed).count());
  return text;
}

}  // namespace

NcclComm::NcclComm(ControlPlane& control, int device, Deadline deadline)
    : rank_(control.rank()), size_(control.size()), device_(device) {
  what_ = "communicator init";
  start_ = Clock::now();
  try {
    // 1. Local setup; group rank 0 also makes the unique id. A failure is remembered, not
    //    thrown, so that every member still takes part in steps 2 and 3.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    std::string bytes;
    std::string local_error;
    auto cuda = [this](cudaError_t result, const char* call) {
      if (result == cudaSuccess) return;
      cudaGetLastError();
      throwError(StatusCode::kBackend, who() + ": communicator init: " + call +
                                           " failed: " + cudaGetErrorName(result) + ": " +
                                           cudaGetErrorString(result));
    };
    try {
      cuda(cudaSetDevice(device_), "cudaSetDevice");
      if (ncclGetVersion(&version_) != ncclSuccess) version_ = NCCL_VERSION_CODE;
      // A non-blocking stream: it never waits for the legacy default stream implicitly;
      // each op orders itself after its input's producer by an event (begin()), and
      // completes by an event of its own (finish()).
      cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
           "cudaStreamCreateWithFlags");
      cuda(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming),
           "cudaEventCreateWithFlags");
      cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      if (rank_ == 0) {
        ncclResult_t result = ncclGetUniqueId(&id);
        if (result != ncclSuccess)
          throwError(StatusCode::kBackend, who() + ": ncclGetUniqueId failed: " +
                                               ncclGetErrorString(result) + lastError());
        bytes.assign(id.internal, sizeof id.internal);
      }
    } catch (const Error& error) {
      local_error = error.what();
    }
    // 2. The control plane carries the id to every member.
    bytes = control.broadcast(bytes, deadline);
    // 3. All members agree that their setup worked, so nobody waits in init for a member
    //    that already gave up.
    std::vector<uint64_t> ok{local_error.empty() && bytes.size() == sizeof id.internal ? 1u : 0u};
    control.allreduceAnd(ok, deadline);
    if (!local_error.empty()) throwError(StatusCode::kBackend, local_error);
    if (bytes.size() != sizeof id.internal)
      throwError(StatusCode::kBackend,
                 who() + ": expected a " + std::to_string(sizeof id.internal) +
                     "-byte ncclUniqueId from group rank 0, got " + std::to_string(bytes.size()) +
                     " bytes (see rank 0's error)");
    if (!ok[0])
      throwError(StatusCode::kBackend, who() +
                                           ": another member of the group could not "
                                           "set up its CUDA device for NCCL (see its error)");
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);

    // 4. Every member inits its rank, non-blocking, and polls until ready or the deadline.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    check(result, "ncclCommInitRankConfig", deadline);
    waitReady("ncclCommInitRankConfig", deadline);
  } catch (...) {
    abortComm();
    destroyStream();
    throw;
  }
}

void NcclComm::destroyStream() {
  if (inputs_ready_) cudaEventDestroy(inputs_ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
  inputs_ready_ = done_ = nullptr;
  stream_ = nullptr;
}

NcclComm::~NcclComm() {
  std::lock_guard<std::mutex> lock(op_mutex_);
  if (comm_ && !poison_.isSet() && !abort_requested_) {
    // A clean finish: wait (bounded) for the stream, then finalize and destroy. Anything
    // that does not finish in time is aborted instead.
    Deadline deadline = deadlineAfter(30.0);
    bool clean = true;
    cudaSetDevice(device_);
    while (cudaStreamQuery(stream_) == cudaErrorNotReady) {
      if (Clock::now() >= deadline) {
        clean = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (clean) {  // non-blocking: ncclInProgress, then polled below
      ncclResult_t finalize = ncclCommFinalize(comm_);
      clean = finalize == ncclSuccess || finalize == ncclInProgress;
    }
    ncclResult_t state = ncclInProgress;
    while (clean && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
           state == ncclInProgress) {
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (clean && state == ncclSuccess) {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
  }
  abortComm();
  destroyStream();
}

std::string NcclComm::who() const {
  return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (CUDA device " +
         std::to_string(device_) + ")";
}

std::unique_lock<std::mutex> NcclComm::begin(const std::string& what, cudaStream_t producer) {
  std::unique_lock<std::mutex> lock(op_mutex_);
  what_ = what;
  start_ = Clock::now();
  poison_.throwIfSet();
  pollErrors("start");
  checkCuda(cudaSetDevice(device_), "cudaSetDevice");
  // The op's stream waits (on the device, not here) for what `producer` enqueued so far.
  checkCuda(cudaEventRecord(inputs_ready_, producer), "cudaEventRecord (inputs ready)");
  checkCuda(cudaStreamWaitEvent(stream_, inputs_ready_, 0), "cudaStreamWaitEvent");
  return lock;
}

void NcclComm::check(ncclResult_t result, const char* call, Deadline deadline) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    waitReady(call, deadline);
    return;
  }
  fail(StatusCode::kBackend,
       who() + ": " + what_ + ": " + call + " failed: " + ncclGetErrorString(result) + lastError());
}

void NcclComm::checkCuda(cudaError_t result, const char* call) {
  if (result == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the message is not repeated later
  fail(StatusCode::kBackend, who() + ": " + what_ + ": " + call + " failed: " +
                                 cudaGetErrorName(result) + ": " + cudaGetErrorString(result));
}

void NcclComm::waitReady(const char* call, Deadline deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail(StatusCode::kBackend, who() + ": " + what_ + ": " + call +
                                     " failed: " + ncclGetErrorString(state) + lastError());
    pollErrors(call);
    if (Clock::now() >= deadline)
      fail(StatusCode::kTimeout,
           who() + ": " + what_ + ": " + call + " still in progress after " +
               seconds(Clock::now() - start_) +
               " (deadline passed); communicator aborted. Did every member of the group "
               "reach this op, with one GPU each?");
    backoff.pause();
  }
}

void NcclComm::finish(Deadline deadline) {
  checkCuda(cudaEventRecord(done_, stream_), "cudaEventRecord (op done)");
  Backoff backoff;
  for (;;) {
    cudaError_t query = cudaEventQuery(done_);
    if (query != cudaSuccess && query != cudaErrorNotReady) checkCuda(query, "cudaEventQuery");
    pollErrors("cudaEventQuery");
    if (query == cudaSuccess) return;
    if (Clock::now() >= deadline)
      fail(StatusCode::kTimeout,
           who() + ": " + what_ + " not finished after " + seconds(Clock::now() - start_) +
               " (deadline passed, TUTTI_TIMEOUT_SECONDS); communicator aborted. A peer is "
               "dead or stuck, or did not run the same op");
    backoff.pause();
  }
}

void NcclComm::pollErrors(const char* call) {
  if (abort_requested_.load()) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      reason = abort_reason_;
    }
    fail(StatusCode::kAborted, who() + ": " + what_ + ": aborted: " + reason);
  }
  if (!comm_) return;
  ncclResult_t state = ncclSuccess;
  ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  if (result != ncclSuccess) state = result;
  if (state != ncclSuccess && state != ncclInProgress)
    fail(StatusCode::kBackend, who() + ": " + what_ + ": asynchronous NCCL error during " + call +
                                   ": " + ncclGetErrorString(state) + lastError());
}

void NcclComm::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  abort_requested_ = true;
  std::unique_lock<std::mutex> lock(op_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the op in flight sees abort_requested_ and aborts
  poison_.set(StatusCode::kAborted, who() + ": aborted: " + reason);
  abortComm();
}

void NcclComm::fail(StatusCode code, const std::string& message) {
  poison_.set(code, message);
  abortComm();
  throw Error(code, message);
}

void NcclComm::abortComm() {
  if (!comm_) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

std::string NcclComm::lastError() const {
  const char* last = ncclGetLastError(comm_);
  if (!last || !*last) return "";
  return std::string(" (NCCL: ") + last + ")";
}

}  // namespace detail
}  // namespace tutti
