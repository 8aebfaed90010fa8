// One NCCL communicator on one CUDA device, with the stream its ops run on.
//
// Streams (docs/nccl.md, "Streams and events"): the stream is non-blocking (it never
// synchronizes with the legacy default stream by itself). Each op 1. records an event on
// the stream that produced its inputs and makes its stream wait for it (begin()), 2. is
// enqueued on its stream, 3. records a completion event there, which finish() polls; once
// it has fired the output is ready for every stream, so the handle completes without a
// device or stream synchronization.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can hang the
// runtime's execution stream: init, enqueue and completion are all polled against a
// Deadline, and a timeout aborts the communicator (ncclCommAbort) before it throws.
//
// Ownership and threads: owned by NcclBackend, used only by the runtime's execution stream
// (one thread at a time: its own, or the background thread when it runs a command inline),
// except abort(), which any thread may call. After a timeout, an async NCCL/CUDA error or abort(),
// the communicator is poisoned: every later call throws the first error again.
#pragma once

#include "backends/backend.h"
#include "base/first_error.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

class NcclComm {
 public:
  // Collective over the members of `control`'s group: 1. each member sets up its device
  // and stream, group rank 0 makes an ncclUniqueId, 2. the control plane broadcasts it,
  // 3. the members AND their setup results, 4. every member inits its rank on CUDA device
  // `device` and polls until NCCL reports it ready or `deadline` passes.
  NcclComm(ControlPlane& control, int device, Deadline deadline);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  int version() const { return version_; }
  ncclComm_t get() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

  // Starts an op described by `what` ("allreduce of 1024 x float32 (sum)"): rethrows the
  // sticky error if poisoned, makes this device current, remembers `what` for messages,
  // and orders the op after the work `producer` enqueued so far (an event recorded there,
  // waited on by the op's stream). The caller names no producer yet: its inputs come from
  // the legacy default stream, where frameworks put their work unless told otherwise.
  // The op lasts as long as the returned lock (abort() then defers to the op's polling).
  std::unique_lock<std::mutex> begin(const std::string& what,
                                     cudaStream_t producer = cudaStreamLegacy);
  // Checks an NCCL enqueue result; ncclInProgress (non-blocking) is polled until the
  // communicator is ready or the deadline passes.
  void check(ncclResult_t result, const char* call, Deadline deadline);
  // Checks a CUDA runtime result of the current op.
  void checkCuda(cudaError_t result, const char* call);
  // Records the completion event after what the op enqueued and waits until it has fired,
  // polling with backoff (cudaEventQuery, ncclCommGetAsyncError, abort requests) until the
  // deadline.
  void finish(Deadline deadline);
  // Rank/device prefix for messages: "NCCL rank 1 of 4 (CUDA device 1)".
  std::string who() const;

  // Any thread. Aborts the communicator now when no op is in flight, else makes the
  // in-flight op abort within a poll interval.
  void abort(const std::string& reason);

 private:
  // Poisons the communicator (aborting it), then throws Error(code, message).
  [[noreturn]] void fail(StatusCode code, const std::string& message);
  // Waits while ncclCommGetAsyncError reports ncclInProgress.
  void waitReady(const char* call, Deadline deadline);
  // Throws when an async NCCL error or an abort request is pending.
  void pollErrors(const char* call);
  void abortComm();  // ncclCommAbort once; caller holds op_mutex_
  void destroyStream();  // the events and the stream, once
  std::string lastError() const;

  int rank_ = 0, size_ = 1, device_ = 0, version_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;  // recorded on the producer, waited on by stream_
  cudaEvent_t done_ = nullptr;          // recorded on stream_ after each op
  std::string what_;         // the current op, for messages
  Clock::time_point start_;  // when the current op began
  std::mutex op_mutex_;      // held during an op; guards comm_
  std::mutex reason_mutex_;  // guards abort_reason_
  std::atomic<bool> abort_requested_{false};
  std::string abort_reason_;
  FirstError poison_;
};

}  // namespace detail
}  // namespace tutti
