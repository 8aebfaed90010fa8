// The two contracts between the core and a communication library.
//
// Transport: one per process, connects it to the job (MPI_COMM_WORLD, a gloo rendezvous,
//   threads in one process) and makes, for a group of ranks (a process set), one ControlPlane
//   and one CPU Backend. Group creation is collective over the group's members only.
// ControlPlane: negotiation bytes (gather to group rank 0, broadcast from it, AND-allreduce
//   of a bit vector). Used only by the background thread.
// Backend: the data plane. Called by one thread at a time, the runtime's execution stream
//   (core/exec_stream.h: its own thread with pipelined rounds, else the background thread),
//   in the same order on every member; set creation (makeBackends) runs while the stream is
//   drained. A backend that cannot run an op for a dtype/device says so in supports(); the
//   core then asks the next backend in the registry's order.
//
// Every blocking call takes a Deadline. On a timeout a backend throws Error(kTimeout, ...)
// naming the op and, where it knows, the peer it was waiting for, and poisons itself (every
// later call fails fast with the same error). abort() does the same from outside.
// abort() may come from any thread. Errors are thrown as tutti::Error; the core catches
// them on the thread that made the call.
#pragma once

#include "base/common.h"

#include <memory>
#include <string>
#include <vector>

namespace tutti {

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;  // index of this process in the group
  virtual int size() const = 0;
  // Group rank 0 receives every member's bytes in rank order (its own included);
  // the others receive an empty vector.
  virtual std::vector<std::string> gather(const std::string& bytes, Deadline deadline) = 0;
  // Returns group rank 0's `bytes` on every member (the others' argument is ignored).
  virtual std::string broadcast(const std::string& bytes, Deadline deadline) = 0;
  // bits[i] = AND over members of bits[i]. Same length on every member.
  virtual void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) = 0;
  virtual void abort(const std::string& reason) = 0;
};

// A run-time switch of a backend's algorithm (autotune flips them). Every member must flip
// it between the same two collectives: the execution stream runs the flip as a command in
// the agreed order (SetBackendSwitch).
enum class BackendSwitch { kHierarchicalAllreduce };

// The scaling of a reduction: out = postscale * reduce(prescale * in) / divisor, where the
// divisor is the set's size for an average and 1 otherwise. The core scales host memory
// itself; device memory it cannot touch, so a device backend that can scale there says so
// (supportsScaling) and does it inside the collective (allreduceScaled, reducescatterScaled).
struct ReduceScaling {
  double prescale = 1.0;
  double postscale = 1.0;
  int64_t divisor = 1;
  bool trivial() const { return prescale == 1.0 && postscale == 1.0 && divisor == 1; }
};

// One tensor of a fused allreduce (Backend::allreducePieces): `count` elements read from
// `in` (nullptr: zeros, the share of a rank that joined) and written to `out` (nullptr: the
// result is dropped). The pieces lie side by side in the reduction, in order; an input is
// read before any output of the same elements is written, so in == out is fine, and no
// output overlaps another piece's input or output.
struct AllreducePiece {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool supports(OpType op, DataType dtype, DeviceType device) const = 0;
  virtual int rank() const = 0;  // index of this process in the group
  virtual int size() const = 0;
  // The algorithm this backend runs for `op` on `bytes` bytes per member ("ring",
  // "shm one-round", "MPI_Allreduce", ...), for the timeline. Valid while the backend lives.
  virtual const char* algorithm(OpType op, int64_t bytes) const = 0;

  // out[i] = op over members of in[i]; in == out means in place. op is never kAverage.
  virtual void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                         Deadline deadline) = 0;
  // Member r contributes counts[r] elements; out holds all of them in rank order.
  virtual void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts,
                          DataType dtype, Deadline deadline) = 0;
  // root is a group rank; buf is read on root and written elsewhere.
  virtual void broadcast(void* buf, int64_t count, DataType dtype, int root,
                         Deadline deadline) = 0;
  // in holds send_counts[j] elements for member j, in member order; out receives
  // recv_counts[j] elements from member j, in member order.
  virtual void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                         const std::vector<int64_t>& recv_counts, DataType dtype,
                         Deadline deadline) = 0;
  // in holds sum(counts) elements on every member; out receives counts[rank()] elements:
  // block rank() of the reduction. op is never kAverage.
  virtual void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                             DataType dtype, ReduceOp op, Deadline deadline) = 0;
  virtual void barrier(Deadline deadline) = 0;
  virtual void abort(const std::string& reason) = 0;

  // Empty where allreduceScaled/reducescatterScaled can apply `scaling` to `op` over `dtype`
  // (op is never kAverage: an average is kSum with divisor = size); else why not. By
  // default no backend can.
  virtual std::string scalingRefusal(DataType dtype, ReduceOp op,
                                     const ReduceScaling& scaling) const;
  // allreduce and reducescatter with `scaling` applied by the backend; only called where
  // scalingRefusal said nothing (the default throws kUnsupported).
  virtual void allreduceScaled(const void* in, void* out, int64_t count, DataType dtype,
                               ReduceOp op, const ReduceScaling& scaling, Deadline deadline);
  virtual void reducescatterScaled(const void* in, void* out, const std::vector<int64_t>& counts,
                                   DataType dtype, ReduceOp op, const ReduceScaling& scaling,
                                   Deadline deadline);

  // A fused allreduce of host memory straight from the tensors into the tensors, without a
  // fusion buffer, where allreducesPieces() says the backend has one (the shared-memory
  // backend copies each piece into its segment and out of it once). `total` is the sum of
  // the pieces' counts. op is never kAverage; the caller scales. The default throws.
  virtual bool allreducesPieces() const { return false; }
  virtual void allreducePieces(const std::vector<AllreducePiece>& pieces, int64_t total,
                               DataType dtype, ReduceOp op, Deadline deadline);

  // A switch this backend has: 1 on, 0 off; -1 when it has no such switch.
  virtual int switchState(BackendSwitch /*which*/) const { return -1; }
  // Sets the switch from the next call on. False (nothing changes) when it has none.
  virtual bool setSwitch(BackendSwitch /*which*/, bool /*on*/) { return false; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;  // "mpi", "gloo", "loopback"
  virtual int rank() const = 0;          // world rank
  virtual int size() const = 0;
  // Collective over the members of `ranks` (sorted world ranks, this process among them).
  // `id` is the process set's id, the same on every member and unique in the job.
  virtual std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks,
                                                         int id) = 0;
  virtual std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) = 0;
};

// Collective over `control`: every member's `line` (no '\n' in it), in member order, on
// every member (a gather and a broadcast).
std::vector<std::string> exchangeLines(ControlPlane& control, const std::string& line,
                                       Deadline deadline);

// Checks a CPU backend makes alike. `what` names the op for the message ("mpi alltoallv ...").
// Throws Error(kInvalidArgument) unless there is one count per member and none is negative.
void checkMemberCounts(const std::vector<int64_t>& counts, int members, const std::string& what);

// alltoallv's counts: checked as above, and what member `me` sends itself must equal what it
// expects from itself. Returns the elements sent and received in all.
struct AlltoallvTotals {
  int64_t send = 0;
  int64_t recv = 0;
};
AlltoallvTotals checkAlltoallvCounts(const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts, int me,
                                     int members, const std::string& what);

}  // namespace tutti
