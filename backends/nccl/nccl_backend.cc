#include "backends/nccl/nccl_backend.h"

#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_types.h"
#include "base/reduce.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

namespace tutti {

namespace {

using detail::NcclComm;
using detail::NcclWireType;

// The data plane for CUDA tensors of one group, over one NCCL communicator. Each op waits
// (on the device) for its inputs' producer stream, is enqueued on the communicator's
// stream and polled to completion by an event before it returns, so its output is ready
// for every stream (nccl_comm.h). Called by the runtime's execution stream only (one thread
// at a time, core/exec_stream.h), except abort() (any thread).
class NcclBackend final : public Backend {
 public:
  NcclBackend(std::unique_ptr<NcclComm> comm, int* scratch)
      : comm_(std::move(comm)), scratch_(scratch) {}

  ~NcclBackend() override {
    int device = comm_->device();
    comm_.reset();  // finishes (or aborts) the stream's work before the scratch goes
    cudaSetDevice(device);
    cudaFree(scratch_);
  }

  const char* name() const override { return "nccl"; }
  const char* algorithm(OpType op, int64_t) const override {
    switch (op) {  // NCCL picks ring, tree or NVLS inside each call (NCCL_ALGO)
      case OpType::kAllreduce: return "ncclAllReduce";
      case OpType::kAllgather: return "ncclAllGather (ncclBroadcast per member if uneven)";
      case OpType::kBroadcast: return "ncclBroadcast";
      case OpType::kAlltoall: return "ncclSend/ncclRecv group";
      case OpType::kReducescatter: return "ncclReduceScatter (ncclReduce per member if uneven)";
      default: return "ncclAllReduce of one int";
    }
  }
  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    return detail::ncclSupports(op, dtype, device, comm_->version());
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    allreduceScaled(in, out, count, dtype, op, ReduceScaling{}, deadline);
  }

  std::string scalingRefusal(DataType dtype, ReduceOp op,
                             const ReduceScaling& scaling) const override {
    return detail::ncclScalingPlan(dtype, op, scaling, size(), comm_->version()).why;
  }

  void allreduceScaled(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                       const ReduceScaling& scaling, Deadline deadline) override {
    std::string what = describe("allreduce", count, dtype, reduceOpName(op));
    NcclWireType wire = wireType(OpType::kAllreduce, dtype);
    checkCount(count, what);
    auto lock = comm_->begin(what);
    if (count == 0) return;
    checkPointer(in, "input", what);
    checkPointer(out, "output", what);
    Reduction red(*comm_, dtype, op, scaling, wire, what, deadline);
    comm_->check(ncclAllReduce(in, out, items(count, wire), wire.type, red.get(), comm_->get(),
                               comm_->stream()),
                 "ncclAllReduce", deadline);
    comm_->finish(deadline);
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    std::string what = describe("allgather", countOf(counts, rank()), dtype, "");
    NcclWireType wire = wireType(OpType::kAllgather, dtype);
    std::vector<int64_t> offsets = offsetsOf(counts, "counts", what);
    auto lock = comm_->begin(what);
    if (offsets.back() == 0) return;
    if (counts[rank()] > 0) checkPointer(in, "input", what);
    checkPointer(out, "output", what);
    if (allEqual(counts)) {
      comm_->check(
          ncclAllGather(in, out, items(counts[0], wire), wire.type, comm_->get(), comm_->stream()),
          "ncclAllGather", deadline);
    } else {
      // Unequal counts: one broadcast per member, rooted at it, into its block of out.
      group(deadline, [&](Recorder& record) {
        for (int r = 0; r < size(); ++r) {
          if (counts[r] == 0) continue;
          record(ncclBroadcast(in, at(out, offsets[r], dtype), items(counts[r], wire), wire.type, r,
                               comm_->get(), comm_->stream()),
                 "ncclBroadcast");
        }
      });
    }
    comm_->finish(deadline);
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root, Deadline deadline) override {
    std::string what = describe("broadcast", count, dtype, "root " + std::to_string(root));
    NcclWireType wire = wireType(OpType::kBroadcast, dtype);
    checkCount(count, what);
    if (root < 0 || root >= size())
      throwError(
          StatusCode::kInvalidArgument,
          comm_->who() + ": " + what + ": root must be in [0, " + std::to_string(size()) + ")");
    auto lock = comm_->begin(what);
    if (count == 0) return;
    checkPointer(buf, "buffer", what);
    comm_->check(
        ncclBroadcast(buf, buf, items(count, wire), wire.type, root, comm_->get(), comm_->stream()),
        "ncclBroadcast", deadline);
    comm_->finish(deadline);
  }

  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    std::string what = describe("alltoall", -1, dtype, "");
    NcclWireType wire = wireType(OpType::kAlltoall, dtype);
    std::vector<int64_t> send_offsets = offsetsOf(send_counts, "send_counts", what);
    std::vector<int64_t> recv_offsets = offsetsOf(recv_counts, "recv_counts", what);
    auto lock = comm_->begin(what);
    if (send_offsets.back() == 0 && recv_offsets.back() == 0) return;
    if (send_offsets.back() > 0) checkPointer(in, "input", what);
    if (recv_offsets.back() > 0) checkPointer(out, "output", what);
    // One send and one receive per peer (itself included), all in one NCCL group.
    group(deadline, [&](Recorder& record) {
      for (int peer = 0; peer < size(); ++peer) {
        if (send_counts[peer] > 0)
          record(ncclSend(at(in, send_offsets[peer], dtype), items(send_counts[peer], wire),
                          wire.type, peer, comm_->get(), comm_->stream()),
                 "ncclSend");
        if (recv_counts[peer] > 0)
          record(ncclRecv(at(out, recv_offsets[peer], dtype), items(recv_counts[peer], wire),
                          wire.type, peer, comm_->get(), comm_->stream()),
                 "ncclRecv");
      }
    });
    comm_->finish(deadline);
  }

  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                     ReduceOp op, Deadline deadline) override {
    reducescatterScaled(in, out, counts, dtype, op, ReduceScaling{}, deadline);
  }

  void reducescatterScaled(const void* in, void* out, const std::vector<int64_t>& counts,
                           DataType dtype, ReduceOp op, const ReduceScaling& scaling,
                           Deadline deadline) override {
    std::string what = describe("reducescatter", countOf(counts, rank()), dtype, reduceOpName(op));
    NcclWireType wire = wireType(OpType::kReducescatter, dtype);
    std::vector<int64_t> offsets = offsetsOf(counts, "counts", what);
    auto lock = comm_->begin(what);
    if (offsets.back() == 0) return;
    checkPointer(in, "input", what);
    if (counts[rank()] > 0) checkPointer(out, "output", what);
    Reduction scaled(*comm_, dtype, op, scaling, wire, what, deadline);
    const ncclRedOp_t red = scaled.get();
    if (allEqual(counts)) {
      comm_->check(ncclReduceScatter(in, out, items(counts[0], wire), wire.type, red, comm_->get(),
                                     comm_->stream()),
                   "ncclReduceScatter", deadline);
    } else {
      // Unequal blocks: one reduce per block, rooted at the member that keeps it.
      group(deadline, [&](Recorder& record) {
        for (int r = 0; r < size(); ++r) {
          if (counts[r] == 0) continue;
          record(ncclReduce(at(in, offsets[r], dtype), out, items(counts[r], wire), wire.type, red,
                            r, comm_->get(), comm_->stream()),
                 "ncclReduce");
        }
      });
    }
    comm_->finish(deadline);
  }

  void barrier(Deadline deadline) override {
    auto lock = comm_->begin("barrier");
    comm_->check(
        ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_->get(), comm_->stream()),
        "ncclAllReduce", deadline);
    comm_->finish(deadline);
  }

  void abort(const std::string& reason) override { comm_->abort(reason); }

 private:
  // The NCCL reduction for `op` with `scaling` applied (nccl_types.h's plan). A PreMulSum op
  // is made on the communicator for one call and destroyed with this object, after that
  // call returned (NCCL allows it once the calls using it are enqueued).
  class Reduction {
   public:
    Reduction(NcclComm& comm, DataType dtype, ReduceOp op, const ReduceScaling& scaling,
              const NcclWireType& wire, const std::string& what, Deadline deadline)
        : comm_(comm) {
      const auto plan = detail::ncclScalingPlan(dtype, op, scaling, comm.size(), comm.version());
      switch (plan.kind) {
        case detail::NcclScalingPlan::kPlain: red_ = detail::ncclReduceOp(op, dtype); break;
#if NCCL_VERSION_CODE >= 21000
        case detail::NcclScalingPlan::kAverage: red_ = ncclAvg; break;
#endif
#if NCCL_VERSION_CODE >= 21100
        case detail::NcclScalingPlan::kPreMulSum: {
          alignas(8) unsigned char scalar[8] = {};  // the factor as one element of dtype
          storeElement(scalar, 0, dtype, plan.factor);
          comm.check(ncclRedOpCreatePreMulSum(&red_, scalar, wire.type, ncclScalarHostImmediate,
                                              comm.get()),
                     "ncclRedOpCreatePreMulSum", deadline);
          created_ = true;
          break;
        }
#endif
        default:
          throwError(StatusCode::kUnsupported, comm.who() + ": " + what + ": " +
                                                   (plan.why.empty() ? "unsupported scaling" : plan.why));
      }
      (void)wire;
      (void)deadline;
    }
    ~Reduction() {
      if (created_) ncclRedOpDestroy(red_, comm_.get());
    }
    Reduction(const Reduction&) = delete;
    Reduction& operator=(const Reduction&) = delete;
    ncclRedOp_t get() const { return red_; }

   private:
    NcclComm& comm_;
    ncclRedOp_t red_ = ncclSum;
    bool created_ = false;
  };

  // Collects the first failing NCCL call inside a group.
  struct Recorder {
    ncclResult_t result = ncclSuccess;
    const char* call = nullptr;
    void operator()(ncclResult_t r, const char* name) {
      if (r != ncclSuccess && r != ncclInProgress && result == ncclSuccess) {
        result = r;
        call = name;
      }
    }
  };

  // ncclGroupStart, the calls, ncclGroupEnd (always, even after a failed call), then the
  // first error, so the group never stays open.
  template <typename Enqueue>
  void group(Deadline deadline, Enqueue&& enqueue) {
    comm_->check(ncclGroupStart(), "ncclGroupStart", deadline);
    Recorder record;
    enqueue(record);
    ncclResult_t end = ncclGroupEnd();
    if (record.result != ncclSuccess) comm_->check(record.result, record.call, deadline);
    comm_->check(end, "ncclGroupEnd", deadline);
  }

  NcclWireType wireType(OpType op, DataType dtype) const {
    return detail::ncclWireType(op, dtype, comm_->version());
  }

  static size_t items(int64_t count, const NcclWireType& wire) {
    return static_cast<size_t>(count * wire.items_per_element);
  }

  static const void* at(const void* base, int64_t offset, DataType dtype) {
    return static_cast<const char*>(base) + offset * dataTypeSize(dtype);
  }
  static void* at(void* base, int64_t offset, DataType dtype) {
    return static_cast<char*>(base) + offset * dataTypeSize(dtype);
  }

  static bool allEqual(const std::vector<int64_t>& counts) {
    for (int64_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }

  static int64_t countOf(const std::vector<int64_t>& counts, int rank) {
    return rank < static_cast<int>(counts.size()) ? counts[rank] : -1;
  }

  std::string describe(const char* op, int64_t count, DataType dtype,
                       const std::string& detail) const {
    std::string text = std::string(op) + " of ";
    text += count >= 0 ? std::to_string(count) + " x " : std::string();
    text += dataTypeName(dtype);
    if (!detail.empty()) text += " (" + detail + ")";
    return text;
  }

  void checkCount(int64_t count, const std::string& what) const {
    if (count < 0)
      throwError(StatusCode::kInvalidArgument,
                 comm_->who() + ": " + what + ": element count must be >= 0");
  }

  // Prefix sums of per-member counts; back() is the total. Checks one count per member.
  std::vector<int64_t> offsetsOf(const std::vector<int64_t>& counts, const char* name,
                                 const std::string& what) const {
    if (static_cast<int>(counts.size()) != size())
      throwError(StatusCode::kInvalidArgument,
                 comm_->who() + ": " + what + ": expected " + std::to_string(size()) + " " + name +
                     " (one per member), got " + std::to_string(counts.size()));
    std::vector<int64_t> offsets(counts.size() + 1, 0);
    for (size_t i = 0; i < counts.size(); ++i) {
      checkCount(counts[i], what);
      offsets[i + 1] = offsets[i] + counts[i];
    }
    return offsets;
  }

  // Device memory on this communicator's device (or managed memory), so that a host or
  // wrong-device pointer is a clear error instead of an illegal access in a kernel.
  void checkPointer(const void* ptr, const char* role, const std::string& what) const {
    cudaPointerAttributes attributes{};
    cudaError_t result = cudaPointerGetAttributes(&attributes, ptr);
    if (result != cudaSuccess) cudaGetLastError();
    bool device_memory = result == cudaSuccess && (attributes.type == cudaMemoryTypeDevice ||
                                                   attributes.type == cudaMemoryTypeManaged);
    if (!device_memory)
      throwError(StatusCode::kInvalidArgument,
                 comm_->who() + ": " + what + ": the " + role +
                     " is not CUDA device memory (expected a tensor on CUDA device " +
                     std::to_string(comm_->device()) + ")");
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != comm_->device())
      throwError(StatusCode::kInvalidArgument,
                 comm_->who() + ": " + what + ": the " + role + " is on CUDA device " +
                     std::to_string(attributes.device) + ", expected CUDA device " +
                     std::to_string(comm_->device()) +
                     " (local rank % device count) for this rank");
  }

  std::unique_ptr<NcclComm> comm_;
  int* scratch_;  // one device int for barrier
};

}  // namespace

std::unique_ptr<Backend> makeNcclBackend(ControlPlane& control, const BackendOptions& options) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error, use no GPU
    devices = 0;
  }
  Deadline deadline = deadlineAfter(options.timeout_seconds);
  // NCCL only if every member of the group has a GPU; otherwise nobody builds it, so the
  // registry gives the whole group the same backend list.
  std::vector<uint64_t> all_have_gpu{devices > 0 ? 1u : 0u};
  control.allreduceAnd(all_have_gpu, deadline);
  if (!all_have_gpu[0]) return nullptr;

  int device = options.local_rank % devices;
  auto comm = std::make_unique<NcclComm>(control, device, deadline);
  void* scratch = nullptr;
  cudaError_t result = cudaMalloc(&scratch, sizeof(int));
  if (result == cudaSuccess) result = cudaMemset(scratch, 0, sizeof(int));
  if (result != cudaSuccess) {
    cudaGetLastError();
    if (scratch) cudaFree(scratch);
    throwError(StatusCode::kBackend, comm->who() + ": barrier scratch (cudaMalloc/cudaMemset): " +
                                         cudaGetErrorString(result));
  }
  return std::make_unique<NcclBackend>(std::move(comm), static_cast<int*>(scratch));
}

}  // namespace tutti
