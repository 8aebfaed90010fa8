// The torch.distributed backend "tutti" (docs/pytorch.md, "torch.distributed backend"): a
// c10d::Backend whose collectives are Tutti's, through the C API only (tutti.h).
//
// - Started from the Store torch's rendezvous made (TCPStore, FileStore, PrefixStore):
//   tutti_init_with_store, with the rank and size torch gives. Where Tutti already runs (the
//   program called tutti.torch.init() under tuttirun or mpirun), its runtime is used; the
//   runtime this backend started is shut down when the last backend using it goes.
// - A process group of some ranks (new_group, new_subgroups, DeviceMesh) runs on a Tutti
//   process set that tutti/torch/distributed.py added, collectively on every rank, when c10d
//   made the group; its backend gets the set's id and uses group ranks, as c10d passes them.
// - c10d issues a group's collectives in the same order on each of its ranks, so each gets
//   the name "c10d.<group>.<n>" (<group>: torch's group name, the same on every rank; n
//   counting the group's collectives): a rank that calls another collective (or another
//   dtype or shape) as its n-th is a mismatch that Tutti reports on every rank, naming them,
//   instead of a hang. The ops are "ordered" (tutti_op_options_t::ordered): agreed by their
//   position from the round's bits, without gathering requests at the set's rank 0.
// - monitored_barrier goes through the group's store, as gloo's goes point to point: rank 0
//   waits for every other rank's key and names those that did not arrive in time.
// - Completions reach torch on a thread of the backend's own (the "completer"): it waits on
//   Tutti's handles in submission order, copies results into torch's output tensors, completes
//   each Work and its Future (where DDP's comm hooks run). Tutti's background thread never
//   runs torch code.
// - CPU tensors only: a CUDA tensor is refused naming the op ("cpu:tutti,cuda:nccl" keeps
//   CUDA tensors on NCCL). Point-to-point (send/recv) is refused naming what is missing.
#include <torch/extension.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2 && __has_include(<torch/csrc/distributed/c10d/Backend.hpp>)
#define TUTTI_HAS_C10D_BACKEND 1
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/exception.h>
#else
#define TUTTI_HAS_C10D_BACKEND 0
#endif

#include <tutti/tutti.h>

#include "torch_dtype.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace py = pybind11;

#if TUTTI_HAS_C10D_BACKEND
namespace tutti {
namespace c10d_backend {
namespace {

using c10d::OpType;
using c10d::ReduceOp;

// Names that moved between torch releases (the extension builds against the environment's
// torch, 2.x). PREMUL_SUM's factor: `PreMulSumSupplement` in newer torch, which keeps
// `NCCLPreMulSumSupplement` as an alias of it; torch 2.11 has only the latter.
using PreMulSupplement = c10d::NCCLPreMulSumSupplement;

// OpType::REDUCE_SCATTER_TENSOR_COALESCED where this torch has it (not in 2.11), else COALESCED.
template <typename T, typename = void>
struct ReduceScatterCoalesced {
  static constexpr T value = T::COALESCED;
};
template <typename T>
struct ReduceScatterCoalesced<T, std::void_t<decltype(T::REDUCE_SCATTER_TENSOR_COALESCED)>> {
  static constexpr T value = T::REDUCE_SCATTER_TENSOR_COALESCED;
};

std::exception_ptr backendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

[[noreturn]] void refuse(const std::string& message) { TORCH_CHECK(false, message); }

tutti_dtype_t toDtype(at::ScalarType type, const char* op) {
  tutti_dtype_t dtype = TUTTI_UINT8;
  if (!torch_ext::toTuttiDtype(type, &dtype))
    refuse(std::string("tutti backend: ") + op + ": tensor dtype " + c10::toString(type) +
           " is not supported (expected " + torch_ext::kSupportedDtypes + ")");
  return dtype;
}

bool isIntegral(at::ScalarType type) {
  return at::isIntegralType(type, /*includeBool=*/true);
}

const char* reduceOpName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "an unknown reduce op";
  }
}

// How a torch reduce op runs: a Tutti reduce op with a prescale, or (bitwise ops) an
// allgather reduced here.
struct Reduction {
  bool bitwise = false;
  ReduceOp::RedOpType torch_op = ReduceOp::SUM;
  tutti_reduce_op_t op = TUTTI_SUM;
  double prescale = 1.0;
};

Reduction reductionFor(const ReduceOp& reduce, at::ScalarType dtype, const char* what) {
  Reduction r;
  r.torch_op = reduce.op_;
  switch (reduce.op_) {
    case ReduceOp::SUM: r.op = TUTTI_SUM; break;
    case ReduceOp::AVG:
      if (isIntegral(dtype))
        refuse(std::string("tutti backend: ") + what + ": ReduceOp.AVG needs a floating dtype, "
               "got " + c10::toString(dtype));
      r.op = TUTTI_AVERAGE;
      break;
    case ReduceOp::PRODUCT: r.op = TUTTI_PRODUCT; break;
    case ReduceOp::MIN: r.op = TUTTI_MIN; break;
    case ReduceOp::MAX: r.op = TUTTI_MAX; break;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      if (!isIntegral(dtype))
        refuse(std::string("tutti backend: ") + what + ": ReduceOp." +
               reduceOpName(reduce.op_) + " needs an integer or bool dtype, got " +
               c10::toString(dtype));
      r.bitwise = true;
      break;
    case ReduceOp::PREMUL_SUM: {
      auto* supplement = dynamic_cast<PreMulSupplement*>(reduce.supplement_.get());
      if (supplement == nullptr || supplement->tensor_factor.defined())
        refuse(std::string("tutti backend: ") + what +
               ": ReduceOp.PREMUL_SUM is supported with a Python number as its factor only");
      r.op = TUTTI_SUM;
      r.prescale = supplement->double_factor;
      break;
    }
    default:
      refuse(std::string("tutti backend: ") + what + ": reduce op " +
             std::to_string(static_cast<int>(reduce.op_)) + " is not supported");
  }
  return r;
}

// Bitwise reduction of `size` equal chunks of `gathered` (rank order) into `out`.
void reduceBitwise(ReduceOp::RedOpType op, const at::Tensor& gathered, int size,
                   at::Tensor& out) {
  auto chunks = gathered.reshape({size, -1});
  at::Tensor acc = chunks[0].clone();
  for (int r = 1; r < size; ++r) {
    if (op == ReduceOp::BAND) acc.bitwise_and_(chunks[r]);
    else if (op == ReduceOp::BOR) acc.bitwise_or_(chunks[r]);
    else acc.bitwise_xor_(chunks[r]);
  }
  out.view(-1).copy_(acc);
}

tutti_tensor_t cTensor(const at::Tensor& t, const char* op) {
  tutti_tensor_t c;
  std::memset(&c, 0, sizeof c);
  c.data = t.data_ptr();
  c.dtype = toDtype(t.scalar_type(), op);
  c.ndim = static_cast<int>(t.dim());
  TORCH_CHECK(c.ndim <= TUTTI_MAX_DIMS, "tutti backend: ", op, ": a tensor of ", c.ndim,
              " dimensions (at most ", TUTTI_MAX_DIMS, ")");
  for (int i = 0; i < c.ndim; ++i) c.shape[i] = t.size(i);
  return c;
}

// A 1-D view of a contiguous tensor; a 0-d tensor becomes 1 element.
tutti_tensor_t flatTensor(const at::Tensor& t, const char* op) {
  tutti_tensor_t c;
  std::memset(&c, 0, sizeof c);
  c.data = t.data_ptr();
  c.dtype = toDtype(t.scalar_type(), op);
  c.ndim = 1;
  c.shape[0] = t.numel();
  return c;
}

// A result Tutti allocated (allgather, alltoall, reducescatter), freed with it.
struct Result {
  tutti_result_t r;
  Result() {
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
  }
  ~Result() {
    tutti_free(r.data);
    tutti_free(r.recv_splits);
  }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
};

class TuttiWork : public c10d::Work {
 public:
  TuttiWork(int rank, OpType type, const char* title, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  // On the completer thread: the Future first (its callbacks run here), then the Work.
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

// One collective in flight: its handles (waited on in order), what turns the results into
// torch's outputs, and its Work.
struct Pending {
  std::string what;  // "allreduce (collective 12 of this process group, ...)"
  std::vector<tutti_handle_t> handles;
  std::vector<bool> with_result;  // wait with tutti_wait_result
  // Called with the results of the handles (null entries for handles without one).
  std::function<void(std::vector<std::unique_ptr<Result>>&)> finish;
  std::vector<at::Tensor> keep_alive;  // tensors Tutti reads or writes until done
  c10::intrusive_ptr<TuttiWork> work;
  double timeout_seconds = -1;
};

// The Tutti runtime the backends share: started by the first backend (from its store) unless
// the program started it; shut down when the last backend that started it is gone.
struct StoreContext {
  c10::intrusive_ptr<c10d::Store> store;
};

std::mutex g_runtime_mu;
int g_users = 0;
bool g_we_started = false;
// The store the runtime we started connects through: kept until that runtime is shut down,
// then let go (torch makes a new one for the next init_process_group).
std::unique_ptr<StoreContext> g_store;

int storeSet(const char* key, const void* value, size_t nbytes, void* user) {
  auto* ctx = static_cast<StoreContext*>(user);
  try {
    const auto* p = static_cast<const uint8_t*>(value);
    ctx->store->set(key, std::vector<uint8_t>(p, p + nbytes));
    return 0;
  } catch (const std::exception& e) {
    TORCH_WARN("tutti backend: store set of '", key, "' failed: ", e.what());
    return 2;
  }
}

// Polls with check() (backing off to 50 ms) rather than blocking in the store's wait(), so
// that every kind of store (TCPStore, FileStore, HashStore, a Python one) keeps to the
// deadline Tutti gives alike.
bool awaitKey(c10d::Store& store, const std::string& key,
              std::chrono::steady_clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  while (!store.check({key})) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return true;
}

int storeGet(const char* key, double timeout_seconds, void** value, size_t* nbytes,
             void* user) {
  auto* ctx = static_cast<StoreContext*>(user);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(timeout_seconds * 1e6));
  try {
    if (!awaitKey(*ctx->store, key, deadline)) return 1;  // not there in time
    std::vector<uint8_t> bytes = ctx->store->get(key);
    *nbytes = bytes.size();
    *value = std::malloc(bytes.empty() ? 1 : bytes.size());
    if (*value == nullptr) return 3;
    if (!bytes.empty()) std::memcpy(*value, bytes.data(), bytes.size());
    return 0;
  } catch (const std::exception& e) {
    TORCH_WARN("tutti backend: reading '", key, "' from torch's store failed: ", e.what());
    return 2;
  }
}

class TuttiBackend : public c10d::Backend {
 public:
  // process_set: 0 for a group of every rank, else the Tutti process set of the group's
  // ranks (added by distributed.py on every rank); group: torch's name of the group.
  TuttiBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout, int process_set, std::string group)
      : c10d::Backend(rank, size),
        timeout_(timeout),
        store_(store),
        process_set_(process_set),
        group_(std::move(group)) {
    {
      std::lock_guard<std::mutex> lock(g_runtime_mu);
      if (process_set_ != TUTTI_GLOBAL_PROCESS_SET) {
        checkProcessSet();
      } else if (tutti_is_initialized()) {
        if (tutti_rank() != rank || tutti_size() != size)
          refuse("tutti backend: process group '" + group_ + "': torch.distributed says rank " +
                 std::to_string(rank) + " of " + std::to_string(size) +
                 ", but Tutti already runs as rank " + std::to_string(tutti_rank()) + " of " +
                 std::to_string(tutti_size()));
      } else {
        auto ctx = std::make_unique<StoreContext>();
        ctx->store = store;
        tutti_store_t s;
        std::memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        s.set = storeSet;
        s.get = storeGet;
        s.user_data = ctx.get();
        s.description = "torch.distributed's store";
        tutti_status_t status;
        std::string error;
        auto start = [&] {
          status = tutti_init_with_store(rank, size, &s);
          if (status != TUTTI_OK) error = tutti_last_error();
        };
        if (PyGILState_Check()) {
          py::gil_scoped_release release;  // a Python store takes the GIL itself
          start();
        } else {
          start();
        }
        if (status != TUTTI_OK)
          refuse("tutti backend: starting Tutti as rank " + std::to_string(rank) + " of " +
                 std::to_string(size) + " failed (" + tutti_status_string(status) +
                 "): " + error);
        g_we_started = true;
        g_store = std::move(ctx);
      }
      ++g_users;
    }
    completer_ = std::thread([this] { completeLoop(); });
  }

  ~TuttiBackend() override { release(); }

  const std::string getBackendName() const override { return "tutti"; }

  // Not `override`: older torch 2.x releases have no Backend::shutdown (nor the two below).
  void shutdown() { release(); }

  void setSequenceNumberForGroup() {}
  uint64_t getSequenceNumberForGroup() { return seq_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    at::Tensor t = single(tensors, "broadcast");
    checkRoot(opts.rootRank, "broadcast");
    at::Tensor buf = t.contiguous();
    auto p = begin(OpType::BROADCAST, "broadcast", {t}, opts.timeout);
    tutti_tensor_t c = cTensor(buf, "broadcast");
    tutti_op_options_t o = defaultOptions();
    o.root = static_cast<int>(opts.rootRank);
    submit(*p, [&](const char* name, tutti_handle_t* h) {
      return tutti_broadcast_tensor_async(name, &c, &o, h);
    }, false);
    p->keep_alive = {t, buf};
    p->finish = [t, buf](std::vector<std::unique_ptr<Result>>&) mutable {
      if (!buf.is_same(t)) t.copy_(buf);
    };
    return enqueue(std::move(p));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    at::Tensor t = single(tensors, "allreduce");
    return reduceInto(OpType::ALLREDUCE, "allreduce", t, opts.reduceOp, -1, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "tutti backend: allreduce_coalesced of no tensors");
    for (auto& t : tensors) checkCpu(t, "allreduce_coalesced");
    // One flat buffer: one negotiation, one op.
    std::vector<at::Tensor> flat;
    for (auto& t : tensors) flat.push_back(t.reshape(-1));
    at::Tensor buf = at::cat(flat);
    auto work = reduceInto(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", buf,
                           opts.reduceOp, -1, opts.timeout, tensors);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    at::Tensor t = single(tensors, "reduce");
    checkRoot(opts.rootRank, "reduce");
    return reduceInto(OpType::REDUCE, "reduce", t, opts.reduceOp,
                      static_cast<int>(opts.rootRank), opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "tutti backend: allgather needs one list of ", size_, " output tensors");
    for (auto& o : outputs[0]) checkOutput(o, in, "allgather");
    std::vector<at::Tensor> outs = outputs[0];
    return gatherInto(OpType::ALLGATHER, "allgather", in, outs, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    checkCpu(input, "all_gather_into_tensor");
    checkCpu(output, "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * size_ &&
                    output.scalar_type() == input.scalar_type(),
                "tutti backend: all_gather_into_tensor: the output must be ", size_,
                " times the input (", input.numel(), " elements of ", input.scalar_type(),
                "), got ", output.numel(), " elements of ", output.scalar_type());
    std::vector<at::Tensor> outs = {output};
    return gatherInto(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", input, outs,
                      opts.timeout, /*whole=*/true);
  }

  // outputs[r][k]: rank r's copy of input k.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "tutti backend: ",
                "allgather_coalesced: ", outputs.size(), " output lists for ", size_, " ranks");
    std::vector<std::vector<at::Tensor>> per_input(inputs.size());
    std::vector<at::Tensor> flat_outs;
    for (size_t k = 0; k < inputs.size(); ++k) checkCpu(inputs[k], "allgather_coalesced");
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(outputs[r].size() == inputs.size(), "tutti backend: allgather_coalesced: ",
                  "output list ", r, " has ", outputs[r].size(), " tensors for ",
                  inputs.size(), " inputs");
      for (size_t k = 0; k < inputs.size(); ++k) {
        checkOutput(outputs[r][k], inputs[k], "allgather_coalesced");
        per_input[k].push_back(outputs[r][k]);
        flat_outs.push_back(outputs[r][k]);
      }
    }
    return gatherMany(OpType::ALLGATHER_COALESCED, "allgather_coalesced", inputs, per_input,
                      flat_outs, opts.timeout, false);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), "tutti backend: ",
                "allgather_into_tensor_coalesced: ", inputs.size(), " inputs but ",
                outputs.size(), " outputs");
    std::vector<std::vector<at::Tensor>> outs;
    for (size_t k = 0; k < inputs.size(); ++k) {
      checkCpu(inputs[k], "allgather_into_tensor_coalesced");
      checkCpu(outputs[k], "allgather_into_tensor_coalesced");
      TORCH_CHECK(outputs[k].numel() == inputs[k].numel() * size_ &&
                      outputs[k].scalar_type() == inputs[k].scalar_type(),
                  "tutti backend: allgather_into_tensor_coalesced: output ", k, " must be ",
                  size_, " times its input");
      outs.push_back({outputs[k]});
    }
    return gatherMany(OpType::COALESCED, "allgather_into_tensor_coalesced", inputs, outs,
                      outputs, opts.timeout, true);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "tutti backend: ",
                "reduce_scatter_tensor_coalesced: ", inputs.size(), " inputs and ",
                outputs.size(), " outputs");
    // One reduce-scatter of the inputs laid side by side: row r holds every input's chunk r.
    std::vector<at::Tensor> rows, outs;
    int64_t width = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      checkCpu(inputs[k], "reduce_scatter_tensor_coalesced");
      checkCpu(outputs[k], "reduce_scatter_tensor_coalesced");
      TORCH_CHECK(inputs[k].numel() == outputs[k].numel() * size_ &&
                      inputs[k].scalar_type() == inputs[0].scalar_type() &&
                      outputs[k].scalar_type() == inputs[0].scalar_type(),
                  "tutti backend: reduce_scatter_tensor_coalesced: input ", k, " must be ",
                  size_, " times its output, all of one dtype");
      rows.push_back(inputs[k].contiguous().view({size_, outputs[k].numel()}));
      width += outputs[k].numel();
    }
    at::Tensor packed = at::cat(rows, 1);  // [size, width]
    at::Tensor out = at::empty({width}, inputs[0].options());
    auto work = reduceScatterInto(ReduceScatterCoalesced<OpType>::value,
                                  "reduce_scatter_tensor_coalesced", packed.view(-1), out,
                                  opts.reduceOp, opts.timeout, outputs);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    at::Tensor in = single(inputs, "gather");
    checkRoot(opts.rootRank, "gather");
    std::vector<at::Tensor> outs;
    if (rank_ == opts.rootRank) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                  "tutti backend: gather: the root needs one list of ", size_,
                  " output tensors");
      for (auto& o : outputs[0]) checkOutput(o, in, "gather");
      outs = outputs[0];
    } else {
      TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                  "tutti backend: gather: only the root (rank ", opts.rootRank,
                  ") passes output tensors");
    }
    return gatherInto(OpType::GATHER, "gather", in, outs, opts.timeout);  // outs: root's only
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    at::Tensor out = single(outputs, "scatter");
    checkRoot(opts.rootRank, "scatter");
    // An alltoall in which only the root sends: row counts are element counts.
    at::Tensor send;
    std::vector<int64_t> splits(size_, 0);
    if (rank_ == opts.rootRank) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                  "tutti backend: scatter: the root needs one list of ", size_,
                  " input tensors");
      std::vector<at::Tensor> flat;
      for (int r = 0; r < size_; ++r) {
        checkOutput(inputs[0][r], out, "scatter");
        flat.push_back(inputs[0][r].reshape(-1));
        splits[r] = inputs[0][r].numel();
      }
      send = at::cat(flat);
    } else {
      TORCH_CHECK(inputs.empty() || inputs[0].empty(),
                  "tutti backend: scatter: only the root (rank ", opts.rootRank,
                  ") passes input tensors");
      send = at::empty({0}, out.options());
    }
    return alltoallInto(OpType::SCATTER, "scatter", send, splits, {out}, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "tutti backend: reduce_scatter needs one list of ", size_, " input tensors");
    std::vector<at::Tensor> flat;
    for (auto& i : inputs[0]) {
      checkOutput(i, out, "reduce_scatter");
      flat.push_back(i.reshape(-1));
    }
    return reduceScatterInto(OpType::REDUCE_SCATTER, "reduce_scatter", at::cat(flat), out,
                             opts.reduceOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    checkCpu(input, "reduce_scatter_tensor");
    checkCpu(output, "reduce_scatter_tensor");
    TORCH_CHECK(input.numel() == output.numel() * size_ &&
                    output.scalar_type() == input.scalar_type(),
                "tutti backend: reduce_scatter_tensor: the input must be ", size_,
                " times the output (", output.numel(), " elements of ", output.scalar_type(),
                "), got ", input.numel(), " elements of ", input.scalar_type());
    return reduceScatterInto(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor",
                             input.contiguous().reshape(-1), output, opts.reduceOp,
                             opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    checkCpu(input, "all_to_all_single");
    checkCpu(output, "all_to_all_single");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                "tutti backend: all_to_all_single: input is ", input.scalar_type(),
                " but output ", output.scalar_type());
    const int64_t rows_in = input.dim() > 0 ? input.size(0) : 1;
    const int64_t row = rows_in > 0 ? input.numel() / rows_in : 0;
    std::vector<int64_t> splits = input_splits;
    if (splits.empty()) {
      TORCH_CHECK(rows_in % size_ == 0, "tutti backend: all_to_all_single: ", rows_in,
                  " rows do not split evenly among ", size_, " ranks; pass input_split_sizes");
      splits.assign(size_, rows_in / size_);
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_,
                "tutti backend: all_to_all_single: ", splits.size(),
                " input split sizes for ", size_, " ranks");
    std::vector<int64_t> elems;
    for (int64_t s : splits) elems.push_back(s * row);
    std::vector<int64_t> expect;
    for (int64_t s : output_splits) expect.push_back(s * row);
    return alltoallInto(OpType::ALLTOALL_BASE, "all_to_all_single",
                        input.contiguous().reshape(-1), elems, {output}, opts.timeout, expect);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                    static_cast<int>(outputs.size()) == size_,
                "tutti backend: all_to_all needs ", size_, " input and ", size_,
                " output tensors, got ", inputs.size(), " and ", outputs.size());
    std::vector<at::Tensor> flat;
    std::vector<int64_t> elems, expect;
    for (int r = 0; r < size_; ++r) {
      checkCpu(inputs[r], "all_to_all");
      checkCpu(outputs[r], "all_to_all");
      TORCH_CHECK(inputs[r].scalar_type() == outputs[r].scalar_type(),
                  "tutti backend: all_to_all: input ", r, " is ", inputs[r].scalar_type(),
                  " but output ", r, " ", outputs[r].scalar_type());
      flat.push_back(inputs[r].reshape(-1));
      elems.push_back(inputs[r].numel());
      expect.push_back(outputs[r].numel());
    }
    return alltoallInto(OpType::ALLTOALL, "all_to_all", at::cat(flat), elems, outputs,
                        opts.timeout, expect);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    auto p = begin(OpType::BARRIER, "barrier", {}, opts.timeout);
    tutti_handle_t h = 0;
    check(tutti_barrier_async(process_set_, &h), *p);
    p->handles.push_back(h);
    p->with_result.push_back(false);
    return enqueue(std::move(p));
  }

  // As gloo's: every rank reports to rank 0, which releases them once all did within the
  // timeout; else rank 0 raises naming the first rank that did not (every one of them with
  // wait_all_ranks) and the others that came raise quoting it. Through the group's store (keys
  // "tutti_monitored_barrier/<k>/...", each deleted by the rank that reads it), not Tutti:
  // a rank that never comes must not leave a collective behind.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    TORCH_CHECK(!released_, "tutti backend: monitored_barrier after process group '", group_,
                "' was shut down");
    const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::string base = "tutti_monitored_barrier/" + std::to_string(++monitored_) + "/";
    const std::string ms = std::to_string(timeout.count());
    std::string failure;
    // A rank that came, as gloo says it, then why.
    const std::string came = "[Rank " + std::to_string(rank_) + "]: Rank " +
                             std::to_string(rank_) + " successfully reached monitoredBarrier, "
                             "but received errors while waiting for send/recv from rank 0: ";
    auto run = [&] {
      if (rank_ != 0) {
        store_->set(base + "arrived/" + std::to_string(rank_), std::vector<uint8_t>{1});
        // Up to twice the timeout: rank 0 gives its verdict once its own has passed.
        const std::string released = base + "released/" + std::to_string(rank_);
        if (!awaitKey(*store_, released, deadline + timeout)) {
          failure = came + "it did not release this rank within twice the timeout of " + ms +
                    " ms (process group '" + group_ + "'; rank 0 did not come)";
          return;
        }
        std::vector<uint8_t> word = store_->get(released);
        forget(released);
        if (!word.empty()) failure = came + std::string(word.begin(), word.end());
        return;
      }
      std::vector<int> missing, passed;
      for (int r = 1; r < size_; ++r) {
        // As gloo: without wait_all_ranks, rank 0 whose time is up before it asks for the
        // next rank times out itself, naming the ranks it saw.
        if (!wait_all_ranks && std::chrono::steady_clock::now() > deadline) {
          std::string seen;
          for (int p : passed) seen += (seen.empty() ? "" : ", ") + std::to_string(p);
          failure = "[Rank 0]: Rank 0 timed out in monitoredBarrier after " + ms +
                    " ms (process group '" + group_ + "'). " +
                    (seen.empty() ? "No ranks successfully processed in monitoredBarrier."
                                  : "Successfully processed ranks: " + seen);
          break;
        }
        const std::string arrived = base + "arrived/" + std::to_string(r);
        if (awaitKey(*store_, arrived, deadline)) {
          forget(arrived);
          passed.push_back(r);
          continue;
        }
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
      if (!missing.empty()) {
        std::string ranks;
        for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        failure = "[Rank 0]: Rank" + std::string(missing.size() > 1 ? "s " : " ") + ranks +
                  " failed to pass monitoredBarrier in " + ms + " ms (process group '" +
                  group_ + "')";
      }
      const std::vector<uint8_t> word(failure.begin(), failure.end());
      for (int r = 1; r < size_; ++r) store_->set(base + "released/" + std::to_string(r), word);
    };
    if (PyGILState_Check()) {
      py::gil_scoped_release release;  // a Python store takes the GIL itself
      run();
    } else {
      run();
    }
    if (!failure.empty()) C10_THROW_ERROR(DistBackendError, "tutti backend: " + failure);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int dst, int) override {
    refuse("tutti backend: send (to rank " + std::to_string(dst) +
           ") is not supported: Tutti has collectives only, no point-to-point transfers "
           "(send, recv, isend, irecv, batch_isend_irecv); use gloo for them "
           "(a process group made with backend='gloo')");
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int src, int) override {
    refuse("tutti backend: recv (from rank " + std::to_string(src) +
           ") is not supported: Tutti has collectives only, no point-to-point transfers "
           "(send, recv, isend, irecv, batch_isend_irecv); use gloo for them "
           "(a process group made with backend='gloo')");
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    refuse("tutti backend: recv from any source is not supported: Tutti has collectives "
           "only; use gloo for point-to-point transfers");
  }

 private:
  // Deletes a store key this rank alone reads (where the store can).
  void forget(const std::string& key) {
    try {
      store_->deleteKey(key);
    } catch (const std::exception&) {
    }
  }

  // ---- checks ----
  void checkCpu(const at::Tensor& t, const char* op) const {
    TORCH_CHECK(t.defined(), "tutti backend: ", op, ": an undefined tensor");
    TORCH_CHECK(t.device().is_cpu(), "tutti backend: ", op, ": tensors must be on the CPU, "
                "got one on ", t.device(), " (the tutti backend has no GPU path yet; use "
                "backend='cpu:tutti,cuda:nccl' or NCCL for CUDA tensors)");
    TORCH_CHECK(!t.is_sparse(), "tutti backend: ", op, ": sparse tensors are not supported");
    TORCH_CHECK(!t.is_complex(), "tutti backend: ", op, ": complex tensors are not supported ("
                "pass torch.view_as_real(tensor))");
  }
  at::Tensor single(std::vector<at::Tensor>& tensors, const char* op) const {
    TORCH_CHECK(tensors.size() == 1, "tutti backend: ", op, " takes one tensor per rank, got ",
                tensors.size());
    checkCpu(tensors[0], op);
    return tensors[0];
  }
  void checkOutput(const at::Tensor& o, const at::Tensor& like, const char* op) const {
    checkCpu(o, op);
    TORCH_CHECK(o.numel() == like.numel() && o.scalar_type() == like.scalar_type(),
                "tutti backend: ", op, ": every tensor of the list must be like the other "
                "argument (", like.numel(), " elements of ", like.scalar_type(), "), got ",
                o.numel(), " of ", o.scalar_type());
  }
  void checkRoot(int64_t root, const char* op) const {
    TORCH_CHECK(root >= 0 && root < size_, "tutti backend: ", op, ": root rank ", root,
                " outside [0, ", size_, ") of process group '", group_, "'");
  }

  // ---- submission ----
  std::unique_ptr<Pending> begin(OpType type, const char* op, std::vector<at::Tensor> outputs,
                                 std::chrono::milliseconds timeout) {
    TORCH_CHECK(!released_, "tutti backend: ", op, " after the process group was shut down");
    auto p = std::make_unique<Pending>();
    const uint64_t n = ++seq_;
    name_ = "c10d." + group_ + "." + std::to_string(n);
    p->what = std::string(op) + " (collective " + std::to_string(n) + " of process group '" +
              group_ + "', on rank " + std::to_string(rank_) + " of " +
              std::to_string(size_) + ", Tutti name '" + name_ + "')";
    p->work = c10::make_intrusive<TuttiWork>(rank_, type, op, std::move(outputs));
    const auto t = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
    p->timeout_seconds = static_cast<double>(t.count()) / 1000.0;
    return p;
  }

  // Tutti's defaults, on this group's process set, ordered: c10d issues a group's
  // collectives in the same order on each of its ranks, so Tutti agrees on them by position
  // (no gather of requests; a rank whose n-th collective differs still fails naming both).
  tutti_op_options_t defaultOptions() const {
    tutti_op_options_t o;
    tutti_op_options_init(&o);
    o.process_set = process_set_;
    o.ordered = 1;
    return o;
  }

  // Under g_runtime_mu: the process set exists and holds this rank as torch says.
  void checkProcessSet() const {
    const std::string what = "tutti backend: process group '" + group_ + "' (rank " +
                             std::to_string(rank_) + " of " + std::to_string(size_) + ")";
    if (!tutti_is_initialized())
      refuse(what + ": Tutti is not running (a group of some ranks needs the world's group "
             "on tutti, or tutti.torch.init(), first)");
    const int set_rank = tutti_process_set_rank(process_set_);
    const int set_size = tutti_process_set_size(process_set_);
    if (set_rank != rank_ || set_size != size_)
      refuse(what + ": its Tutti process set " + std::to_string(process_set_) +
             " has this rank as " + std::to_string(set_rank) + " of " +
             std::to_string(set_size));
  }

  // A collective that cannot start: a failure of the job (a rank gone, the job stopped, a
  // backend's error, a timeout, ranks that disagree) is torch's DistBackendError, as when
  // one fails on the way; bad input on this rank is a plain RuntimeError.
  void check(tutti_status_t status, const Pending& p) const {
    if (status == TUTTI_OK) return;
    const std::string message = "tutti backend: " + p.what + " could not start (" +
                                tutti_status_string(status) + "): " + tutti_last_error();
    if (status == TUTTI_ERR_ABORTED || status == TUTTI_ERR_BACKEND ||
        status == TUTTI_ERR_TIMEOUT || status == TUTTI_ERR_MISMATCH)
      C10_THROW_ERROR(DistBackendError, message);
    refuse(message);
  }

  // Submits one op of `p` under the collective's name (suffixed by its index after the first).
  template <typename F>
  void submit(Pending& p, F&& start, bool with_result) {
    std::string name = name_;
    if (!p.handles.empty()) name += "." + std::to_string(p.handles.size());
    tutti_handle_t h = 0;
    check(start(name.c_str(), &h), p);
    p.handles.push_back(h);
    p.with_result.push_back(with_result);
  }

  c10::intrusive_ptr<c10d::Work> reduceInto(OpType type, const char* op, at::Tensor t,
                                            const ReduceOp& reduce, int root,
                                            std::chrono::milliseconds timeout,
                                            std::vector<at::Tensor> scatter_back = {}) {
    checkCpu(t, op);
    const Reduction r = reductionFor(reduce, t.scalar_type(), op);
    std::vector<at::Tensor> outputs = scatter_back.empty() ? std::vector<at::Tensor>{t}
                                                           : scatter_back;
    auto p = begin(type, op, outputs, timeout);
    at::Tensor in = t.contiguous();
    const int size = size_;
    const bool mine = root < 0 || root == rank_;
    auto deliver = [t, scatter_back, mine](const at::Tensor& result) mutable {
      if (!mine) return;
      if (scatter_back.empty()) {
        if (!result.is_same(t)) t.copy_(result.view(t.sizes()));
        return;
      }
      int64_t at = 0;
      for (auto& out : scatter_back) {
        out.copy_(result.narrow(0, at, out.numel()).view(out.sizes()));
        at += out.numel();
      }
    };
    if (r.bitwise) {
      tutti_tensor_t c = flatTensor(in, op);
      const tutti_op_options_t o = defaultOptions();
      submit(*p, [&](const char* name, tutti_handle_t* h) {
        return tutti_allgather_async(name, &c, &o, h);
      }, true);
      const auto torch_op = r.torch_op;
      p->keep_alive = {in};
      p->finish = [in, size, torch_op, deliver](std::vector<std::unique_ptr<Result>>& res)
          mutable {
        at::Tensor gathered = at::from_blob(res[0]->r.data, {in.numel() * size}, in.options());
        at::Tensor acc = at::empty({in.numel()}, in.options());
        reduceBitwise(torch_op, gathered, size, acc);
        deliver(acc);
      };
      return enqueue(std::move(p));
    }
    // In place where the tensor is contiguous and the result is everyone's.
    at::Tensor out = (in.is_same(t) && mine && scatter_back.empty()) ? in : at::empty_like(in);
    tutti_tensor_t ci = cTensor(in, op);
    tutti_tensor_t co = cTensor(out, op);
    tutti_op_options_t o = defaultOptions();
    o.op = r.op;
    o.prescale = r.prescale;
    submit(*p, [&](const char* name, tutti_handle_t* h) {
      return tutti_allreduce_tensor_async(name, &ci, &co, &o, h);
    }, false);
    p->keep_alive = {in, out};
    p->finish = [out, deliver](std::vector<std::unique_ptr<Result>>&) mutable { deliver(out); };
    return enqueue(std::move(p));
  }

  // Allgather of `in`; rank order chunks go to `outs` (one per rank, or one `whole` tensor),
  // where a rank passes any (a gather's non-roots pass none and drop theirs).
  c10::intrusive_ptr<c10d::Work> gatherInto(OpType type, const char* op, at::Tensor in,
                                            std::vector<at::Tensor> outs,
                                            std::chrono::milliseconds timeout,
                                            bool whole = false) {
    return gatherMany(type, op, {in}, {outs}, outs, timeout, whole);
  }

  // One allgather per input (one collective: names "<name>", "<name>.1", ...); input k's
  // chunks go to outs[k] (one tensor per rank, or one `whole` tensor; none: dropped).
  c10::intrusive_ptr<c10d::Work> gatherMany(OpType type, const char* op,
                                            std::vector<at::Tensor> ins,
                                            std::vector<std::vector<at::Tensor>> outs,
                                            std::vector<at::Tensor> work_outputs,
                                            std::chrono::milliseconds timeout, bool whole) {
    auto p = begin(type, op, work_outputs, timeout);
    std::vector<at::Tensor> bufs;
    for (auto& in : ins) {
      at::Tensor buf = in.contiguous();
      tutti_tensor_t c = flatTensor(buf, op);
      const tutti_op_options_t o = defaultOptions();
      submit(*p, [&](const char* name, tutti_handle_t* h) {
        return tutti_allgather_async(name, &c, &o, h);
      }, true);
      bufs.push_back(buf);
    }
    const int size = size_;
    p->keep_alive = bufs;
    p->finish = [outs, size, whole, bufs](std::vector<std::unique_ptr<Result>>& res) mutable {
      for (size_t k = 0; k < bufs.size(); ++k) {
        const tutti_result_t& r = res[k]->r;
        const at::Tensor& buf = bufs[k];
        const int64_t n = buf.numel();
        TORCH_CHECK(r.nbytes == n * size * buf.element_size(),
                    "ranks gathered tensors of different sizes (this rank's has ", n,
                    " elements; all together ", r.nbytes / buf.element_size(), ")");
        if (k >= outs.size() || outs[k].empty()) continue;
        at::Tensor all = at::from_blob(r.data, {n * size}, buf.options());
        if (whole) {
          outs[k][0].view(-1).copy_(all);
          continue;
        }
        for (int i = 0; i < size; ++i) outs[k][i].view(-1).copy_(all.narrow(0, i * n, n));
      }
    };
    return enqueue(std::move(p));
  }

  // Reduce-scatter of `in` ([size * out.numel()]) into `out`; with `split`, `out` is then
  // copied piece by piece into those tensors (the Work's outputs).
  c10::intrusive_ptr<c10d::Work> reduceScatterInto(OpType type, const char* op, at::Tensor in,
                                                   at::Tensor out, const ReduceOp& reduce,
                                                   std::chrono::milliseconds timeout,
                                                   std::vector<at::Tensor> split = {}) {
    const Reduction r = reductionFor(reduce, in.scalar_type(), op);
    TORCH_CHECK(!r.bitwise, "tutti backend: ", op, ": ReduceOp.", reduceOpName(r.torch_op),
                " is not supported for reduce-scatter (SUM, AVG, PRODUCT, MIN, MAX, "
                "PREMUL_SUM are)");
    auto p = begin(type, op, split.empty() ? std::vector<at::Tensor>{out} : split, timeout);
    at::Tensor buf = in.contiguous().view({size_, out.numel()});  // one row per rank
    tutti_tensor_t c = cTensor(buf, op);
    tutti_op_options_t o = defaultOptions();
    o.op = r.op;
    o.prescale = r.prescale;
    submit(*p, [&](const char* name, tutti_handle_t* h) {
      return tutti_reducescatter_async(name, &c, &o, h);
    }, true);
    p->keep_alive = {buf};
    p->finish = [out, split](std::vector<std::unique_ptr<Result>>& res) mutable {
      const tutti_result_t& r = res[0]->r;
      TORCH_CHECK(r.nbytes == out.numel() * out.element_size(),
                  "reduce-scatter gave this rank ", r.nbytes, " bytes for an output of ",
                  out.numel() * out.element_size());
      out.view(-1).copy_(at::from_blob(r.data, {out.numel()}, out.options()));
      int64_t at = 0;
      for (auto& piece : split) {
        piece.view(-1).copy_(out.narrow(0, at, piece.numel()));
        at += piece.numel();
      }
    };
    return enqueue(std::move(p));
  }

  // Alltoall of the 1-D `send` (elems[r] elements to rank r); what arrives is copied into
  // `outs` in order. `expect` (may be empty): the element counts each rank must send here.
  c10::intrusive_ptr<c10d::Work> alltoallInto(OpType type, const char* op, at::Tensor send,
                                              std::vector<int64_t> elems,
                                              std::vector<at::Tensor> outs,
                                              std::chrono::milliseconds timeout,
                                              std::vector<int64_t> expect = {}) {
    auto p = begin(type, op, outs, timeout);
    at::Tensor buf = send.contiguous();
    tutti_tensor_t c = flatTensor(buf, op);
    tutti_op_options_t o = defaultOptions();
    auto splits = std::make_shared<std::vector<int64_t>>(elems);
    o.splits = splits->data();
    o.nsplits = static_cast<int>(splits->size());
    submit(*p, [&](const char* name, tutti_handle_t* h) {
      return tutti_alltoall_async(name, &c, &o, h);
    }, true);
    const int rank = rank_;
    p->keep_alive = {buf};
    p->finish = [outs, expect, buf, splits, rank](
                    std::vector<std::unique_ptr<Result>>& res) mutable {
      const tutti_result_t& r = res[0]->r;
      if (!expect.empty()) {
        for (int i = 0; i < r.nsplits && i < static_cast<int>(expect.size()); ++i)
          TORCH_CHECK(r.recv_splits[i] == expect[i], "rank ", i, " sent ", r.recv_splits[i],
                      " elements to rank ", rank, ", which expected ", expect[i],
                      " (output split sizes disagree with the sender's input split sizes)");
      }
      int64_t total = 0;
      for (auto& out : outs) total += out.numel();
      TORCH_CHECK(r.nbytes == total * buf.element_size(), "rank ", rank, " received ",
                  r.nbytes / buf.element_size(), " elements for outputs of ", total);
      at::Tensor all = at::from_blob(r.data, {total}, buf.options());
      int64_t at = 0;
      for (auto& out : outs) {
        out.view(-1).copy_(all.narrow(0, at, out.numel()));
        at += out.numel();
      }
    };
    return enqueue(std::move(p));
  }

  c10::intrusive_ptr<c10d::Work> enqueue(std::unique_ptr<Pending> p) {
    auto work = p->work;
    std::vector<c10::intrusive_ptr<TuttiWork>> spent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(p));
      spent.swap(spent_);
    }
    cv_.notify_one();
    return work;  // `spent` goes here, on the caller's (a Python) thread
  }

  // ---- the completer thread ----
  void completeLoop() {
    for (;;) {
      std::unique_ptr<Pending> p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      complete(*p);
    }
  }

  void complete(Pending& p) {
    std::vector<std::unique_ptr<Result>> results;
    std::string error;
    for (size_t i = 0; i < p.handles.size(); ++i) {
      tutti_status_t status;
      if (p.with_result[i]) {
        results.push_back(std::make_unique<Result>());
        status = tutti_wait_result(p.handles[i], p.timeout_seconds, &results.back()->r);
      } else {
        results.push_back(nullptr);
        status = tutti_wait(p.handles[i], p.timeout_seconds);
      }
      if (status != TUTTI_OK && error.empty()) {
        error = std::string(tutti_status_string(status)) + ": " + tutti_last_error();
        if (status == TUTTI_ERR_IN_PROGRESS) {
          char seconds[32];
          std::snprintf(seconds, sizeof seconds, "%g", p.timeout_seconds);
          error = std::string("timed out: the process group's timeout of ") + seconds +
                  " s passed before it completed (" + tutti_last_error() + ")";
        }
      }
    }
    std::exception_ptr failure;
    if (error.empty() && p.finish) {
      try {
        p.finish(results);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!error.empty()) failure = backendError("tutti backend: " + p.what + " failed: " + error);
    // The completer lets go of every tensor before the Work wakes its waiter, whose own
    // references keep them alive: a tensor whose last reference goes here, after the
    // waiter's program went on to exit, would need the GIL while Python finalizes (and
    // that ends this thread inside a destructor: std::terminate). Its reference to the
    // Work goes on the next submitting thread, or with the backend.
    p.finish = nullptr;
    p.keep_alive.clear();
    results.clear();
    c10::intrusive_ptr<TuttiWork> work = std::move(p.work);
    work->complete(failure);
    std::lock_guard<std::mutex> lock(mu_);
    spent_.push_back(std::move(work));
  }

  // Stops the completer once what was queued is done; gives the runtime up.
  void release() {
    std::lock_guard<std::mutex> once(release_mu_);
    if (released_) return;
    released_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (completer_.joinable()) {
      // Callbacks of pending futures may take the GIL: never hold it while joining (torch
      // calls this with or without it).
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        completer_.join();
      } else {
        completer_.join();
      }
    }
    spent_.clear();  // the completer has stopped
    std::lock_guard<std::mutex> lock(g_runtime_mu);
    if (--g_users == 0 && g_we_started) {
      tutti_shutdown();
      g_we_started = false;
      g_store.reset();
    }
  }

  const std::chrono::milliseconds timeout_;
  const c10::intrusive_ptr<c10d::Store> store_;  // the group's (monitored_barrier)
  const int process_set_;
  const std::string group_;
  uint64_t seq_ = 0;
  uint64_t monitored_ = 0;  // monitored barriers so far
  std::string name_;  // of the collective being submitted
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  std::vector<c10::intrusive_ptr<TuttiWork>> spent_;  // completed; dropped by enqueue()
  bool stop_ = false;
  std::mutex release_mu_;
  bool released_ = false;
  std::thread completer_;
};

c10::intrusive_ptr<c10d::Backend> makeBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, double timeout_seconds,
                                              int process_set, const std::string& group) {
  return c10::make_intrusive<TuttiBackend>(
      store, rank, size,
      std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0)), process_set,
      group);
}

}  // namespace
}  // namespace c10d_backend
}  // namespace tutti
#endif  // TUTTI_HAS_C10D_BACKEND

namespace tutti {
namespace detail {

// Adds _C.make_c10d_backend(store, rank, size, timeout_seconds, process_set, group) where this
// torch has c10d::Backend (torch 2.x), and _C.C10D_BACKEND (why not, where it has none).
void defineC10dBackend(py::module& m) {
#if TUTTI_HAS_C10D_BACKEND
  m.attr("C10D_BACKEND") = py::none();
  m.def("make_c10d_backend", &tutti::c10d_backend::makeBackend, py::arg("store"),
        py::arg("rank"), py::arg("size"), py::arg("timeout_seconds"),
        py::arg("process_set"), py::arg("group"));
#else
  m.attr("C10D_BACKEND") = py::str(
      "the torch.distributed backend needs torch 2.0 or newer (with c10d::Backend); this "
      "tutti.torch was built against torch " TORCH_VERSION);
#endif
}

}  // namespace detail
}  // namespace tutti
