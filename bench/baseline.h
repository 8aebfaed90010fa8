// The bare backend a Tutti row is compared with: the same collective called directly on the
// library Tutti's CPU backend uses (MPI on MPI_COMM_WORLD; gloo on its own context), on the
// same buffers. Blocking calls on the calling (main) thread; not thread-safe.
#pragma once

#include "bench/options.h"

#include <tutti/tutti.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace tutti {
namespace bench {

class Baseline {
 public:
  virtual ~Baseline() = default;
  virtual const char* name() const = 0;  // "mpi", "gloo"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the library has the collective for this dtype and op (MPI lacks 16-bit floats
  // natively: this baseline gives them a user op, as Tutti's MPI backend must). fusion and
  // latency use kAllreduce.
  virtual bool supports(Workload workload, DataType dtype, ReduceOp op) const = 0;

  // in == out: in place. kAverage is a sum followed by a 1/size scale, as in Tutti.
  virtual void allreduce(const void* in, void* out, int64_t count, DataType dtype,
                         ReduceOp op) = 0;
  // Every rank sends `count` elements; out holds size() * count in rank order.
  virtual void allgather(const void* in, void* out, int64_t count, DataType dtype) = 0;
  virtual void broadcast(void* buf, int64_t count, DataType dtype, int root) = 0;
  // `count` elements to and from every peer.
  virtual void alltoall(const void* in, void* out, int64_t count, DataType dtype) = 0;
  // in holds size() * count elements; out receives block rank() of the reduction.
  virtual void reducescatter(const void* in, void* out, int64_t count, DataType dtype,
                             ReduceOp op) = 0;
  virtual void barrier() = 0;
};

// Initializes MPI with MPI_THREAD_MULTIPLE when this process was started by Open MPI and
// the build has MPI, before tutti::init (which then keeps MPI as it finds it and leaves it
// initialized at shutdown). Returns whether it did; finalizeLaunchMpi() undoes it.
bool initLaunchMpi();
void finalizeLaunchMpi();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is up (a fatal error on one rank); else nothing.
void abortLaunchMpi(int code);

// The bare baseline for `backend` ("mpi", "gloo"), or null with `why` explaining what is
// missing. Collective over all ranks (the gloo one connects its pairs through Tutti's
// allgather): call after tutti::init on every rank.
std::unique_ptr<Baseline> makeBaseline(const std::string& backend, std::string* why);

}  // namespace bench
}  // namespace tutti
