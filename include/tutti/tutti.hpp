// Tutti C++ API: the same runtime as tutti.h, with Status objects, shapes, options structs
// and std::function callbacks. Safe to call from any thread; nothing here throws.
//
// Header-only: every function is an inline wrapper over the C API, so that only C symbols
// cross the library boundary and a program (or the PyTorch extension) built with any C++
// standard library ABI (_GLIBCXX_USE_CXX11_ABI 0 or 1) works with any libtutti.so.
#pragma once

#include <tutti/tutti.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tutti {

enum class DataType : int {
  kUInt8 = TUTTI_UINT8,
  kInt8 = TUTTI_INT8,
  kUInt16 = TUTTI_UINT16,
  kInt16 = TUTTI_INT16,
  kInt32 = TUTTI_INT32,
  kInt64 = TUTTI_INT64,
  kFloat16 = TUTTI_FLOAT16,
  kBFloat16 = TUTTI_BFLOAT16,
  kFloat32 = TUTTI_FLOAT32,
  kFloat64 = TUTTI_FLOAT64,
  kBool = TUTTI_BOOL,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int {
  kSum = TUTTI_SUM,
  kAverage = TUTTI_AVERAGE,
  kMin = TUTTI_MIN,
  kMax = TUTTI_MAX,
  kProduct = TUTTI_PRODUCT,
};

enum class StatusCode : int {
  kOk = TUTTI_OK,
  kInvalidArgument = TUTTI_ERR_INVALID_ARGUMENT,
  kMismatch = TUTTI_ERR_MISMATCH,
  kTimeout = TUTTI_ERR_TIMEOUT,
  kAborted = TUTTI_ERR_ABORTED,
  kNotInitialized = TUTTI_ERR_NOT_INITIALIZED,
  kBackend = TUTTI_ERR_BACKEND,
  kUnsupported = TUTTI_ERR_UNSUPPORTED,
  kInProgress = TUTTI_ERR_IN_PROGRESS,
  kJoined = TUTTI_ERR_JOINED,
  kDuplicateName = TUTTI_ERR_DUPLICATE_NAME,
  kInternal = TUTTI_ERR_INTERNAL,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  // CUDA ordinal
};

// A non-owning view of a dense, contiguous tensor. Its device type goes with the op (every
// tensor of one op lives on the same kind of device); the index is the caller's to select.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // empty = scalar
  Device device;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using Handle = int64_t;  // 0 is never valid

// Called on the background thread when an op finishes; must not block.
using Callback = std::function<void(Handle, const Status&)>;
// Called on the background thread once an output's shape is known (allgather, alltoall,
// reducescatter). Returns memory for the output: shape's elements of the op's dtype, on
// the input's device. Without one, Tutti mallocs the output and the caller frees it.
using OutputAllocator = std::function<void*(const std::vector<int64_t>& shape)>;

struct OpOptions {
  ReduceOp op = ReduceOp::kSum;  // allreduce, reducescatter
  double prescale = 1.0;         // applied to the input before reducing
  double postscale = 1.0;        // applied to the result (after the 1/size of kAverage)
  int root = 0;                  // broadcast: rank within the process set
  int process_set = TUTTI_GLOBAL_PROCESS_SET;
  std::vector<int64_t> splits;   // alltoall: rows to each rank of the set; empty = equal
  Callback callback;
  OutputAllocator allocator;
  // The caller issues the set's ordered ops in the same order on every rank: agreed by
  // position, without a gather of requests (tutti_op_options_t::ordered).
  bool ordered = false;
};

struct Result {
  void* data = nullptr;  // output of allgather/alltoall/reducescatter: from options.allocator,
                         // else malloc'd by Tutti (release with std::free or tutti_free)
  int64_t nbytes = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> recv_splits;  // alltoall
  int last_joined_rank = -1;         // join
};

// ---- implementation: inline wrappers over the C API ----
namespace capi {

inline Status statusOf(tutti_status_t s) {
  if (s == TUTTI_OK) return Status();
  return Status(static_cast<StatusCode>(s), tutti_last_error());
}

inline Status invalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

// 'name' for messages, its first 64 bytes and its length when longer (as the C API does).
inline std::string quoted(const std::string& name) {
  if (name.size() <= 64) return "'" + name + "'";
  return "'" + name.substr(0, 64) + "...'(" + std::to_string(name.size()) + " bytes)";
}

// A view as a C tensor; refused when it has more dimensions than the C struct carries.
inline Status toC(const char* op, const std::string& name, const TensorView& v,
                  tutti_tensor_t* t) {
  if (v.shape.size() > TUTTI_MAX_DIMS)
    return invalidArgument(std::string(op) + " " + quoted(name) + ": shape has " +
                           std::to_string(v.shape.size()) + " dimensions, expected at most " +
                           std::to_string(TUTTI_MAX_DIMS));
  t->data = v.data;
  t->dtype = static_cast<tutti_dtype_t>(v.dtype);
  t->ndim = static_cast<int>(v.shape.size());
  for (size_t i = 0; i < v.shape.size(); ++i) t->shape[i] = v.shape[i];
  return Status();
}

// One op's callback and allocator on their way through the C API's user_data; the C API
// calls release once it no longer uses them (also when the submission fails).
struct Carrier {
  Callback callback;
  OutputAllocator allocator;

  static void call(tutti_handle_t h, tutti_status_t s, const char* message, void* user) {
    static_cast<Carrier*>(user)->callback(
        h, s == TUTTI_OK ? Status() : Status(static_cast<StatusCode>(s), message ? message : ""));
  }
  static void* allocate(const int64_t* shape, int ndim, void* user) {
    try {
      return static_cast<Carrier*>(user)->allocator(std::vector<int64_t>(shape, shape + ndim));
    } catch (...) {
      return nullptr;  // the op fails: Tutti could not get the output's memory
    }
  }
  static void release(void* user) { delete static_cast<Carrier*>(user); }
};

// OpOptions as tutti_op_options_t; splits point into `o`, which must outlive the call.
// The carrier, if any, is the C API's once the options are passed to a call.
inline tutti_op_options_t toC(const OpOptions& o, DeviceType device) {
  tutti_op_options_t c;
  tutti_op_options_init(&c);
  c.op = static_cast<tutti_reduce_op_t>(o.op);
  c.prescale = o.prescale;
  c.postscale = o.postscale;
  c.root = o.root;
  c.process_set = o.process_set;
  c.splits = o.splits.empty() ? nullptr : o.splits.data();
  c.nsplits = static_cast<int>(o.splits.size());
  c.device = device == DeviceType::kCuda ? TUTTI_DEVICE_CUDA : TUTTI_DEVICE_CPU;
  c.ordered = o.ordered ? 1 : 0;
  if (o.callback || o.allocator) {
    c.user_data = new Carrier{o.callback, o.allocator};
    c.callback = o.callback ? &Carrier::call : nullptr;
    c.allocator = o.allocator ? &Carrier::allocate : nullptr;
    c.release = &Carrier::release;
  }
  return c;
}

// One output op (allgather, alltoall, reducescatter) through its C entry.
using OutputOp = tutti_status_t (*)(const char*, const tutti_tensor_t*, const tutti_op_options_t*,
                                    tutti_handle_t*);
inline Status outputOp(OutputOp fn, const char* op, const std::string& name,
                       const TensorView& input, const OpOptions& options, Handle* handle) {
  tutti_tensor_t t{};
  Status s = toC(op, name, input, &t);
  if (!s.ok()) return s;
  const tutti_op_options_t c = toC(options, input.device.type);
  return statusOf(fn(name.c_str(), &t, &c, handle));
}

}  // namespace capi

inline Status init() { return capi::statusOf(tutti_init()); }
inline Status shutdown() { return capi::statusOf(tutti_shutdown()); }
inline bool isInitialized() { return tutti_is_initialized() != 0; }
inline int rank() { return tutti_rank(); }
inline int size() { return tutti_size(); }
inline int localRank() { return tutti_local_rank(); }
inline int localSize() { return tutti_local_size(); }
inline int crossRank() { return tutti_cross_rank(); }
inline int crossSize() { return tutti_cross_size(); }

inline Status allreduceAsync(const std::string& name, const TensorView& input,
                             const TensorView& output, const OpOptions& options, Handle* handle) {
  tutti_tensor_t in{}, out{};
  Status s = capi::toC("allreduce", name, input, &in);
  if (s.ok()) s = capi::toC("allreduce", name, output, &out);
  if (!s.ok()) return s;
  const tutti_op_options_t c = capi::toC(options, input.device.type);
  return capi::statusOf(tutti_allreduce_tensor_async(name.c_str(), &in, &out, &c, handle));
}

inline Status groupedAllreduceAsync(const std::vector<std::string>& names,
                                    const std::vector<TensorView>& inputs,
                                    const std::vector<TensorView>& outputs,
                                    const OpOptions& options, Handle* handle) {
  if (names.size() != inputs.size() || names.size() != outputs.size() || names.empty())
    return capi::invalidArgument(
        "grouped_allreduce: got " + std::to_string(names.size()) + " names, " +
        std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
        " outputs; expected the same non-zero count");
  std::vector<const char*> cnames(names.size());
  std::vector<tutti_tensor_t> in(names.size()), out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (inputs[i].device.type != inputs[0].device.type)
      return capi::invalidArgument("grouped_allreduce " + capi::quoted(names[i]) +
                                     ": on another kind of device than " +
                                     capi::quoted(names[0]) + "; one group, one device");
    cnames[i] = names[i].c_str();
    Status s = capi::toC("grouped_allreduce", names[i], inputs[i], &in[i]);
    if (s.ok()) s = capi::toC("grouped_allreduce", names[i], outputs[i], &out[i]);
    if (!s.ok()) return s;
  }
  const tutti_op_options_t c = capi::toC(options, inputs[0].device.type);
  return capi::statusOf(tutti_grouped_allreduce_async(
      cnames.data(), in.data(), out.data(), static_cast<int>(names.size()), &c, handle));
}

inline Status broadcastAsync(const std::string& name, const TensorView& buffer,
                             const OpOptions& options, Handle* handle) {
  tutti_tensor_t t{};
  Status s = capi::toC("broadcast", name, buffer, &t);
  if (!s.ok()) return s;
  const tutti_op_options_t c = capi::toC(options, buffer.device.type);
  return capi::statusOf(tutti_broadcast_tensor_async(name.c_str(), &t, &c, handle));
}

inline Status allgatherAsync(const std::string& name, const TensorView& input,
                             const OpOptions& options, Handle* handle) {
  return capi::outputOp(tutti_allgather_async, "allgather", name, input, options, handle);
}
inline Status alltoallAsync(const std::string& name, const TensorView& input,
                            const OpOptions& options, Handle* handle) {
  return capi::outputOp(tutti_alltoall_async, "alltoall", name, input, options, handle);
}
inline Status reducescatterAsync(const std::string& name, const TensorView& input,
                                 const OpOptions& options, Handle* handle) {
  return capi::outputOp(tutti_reducescatter_async, "reducescatter", name, input, options,
                          handle);
}
inline Status barrierAsync(int process_set, Handle* handle) {
  return capi::statusOf(tutti_barrier_async(process_set, handle));
}
inline Status joinAsync(int process_set, Handle* handle) {
  return capi::statusOf(tutti_join_async(process_set, handle));
}

inline Status poll(Handle handle, bool* done) {
  if (done == nullptr) return capi::invalidArgument("poll: done pointer is null");
  int d = 0;
  Status s = capi::statusOf(tutti_poll(handle, &d));
  *done = d != 0;
  return s;
}

// timeout_seconds < 0: wait up to TUTTI_TIMEOUT_SECONDS. kInProgress keeps the handle;
// any other outcome releases it. `result` may be null. Of several threads waiting on one
// handle, one gets the op; the others kInvalidArgument (docs/c_api.md, "Handles").
inline Status wait(Handle handle, double timeout_seconds, Result* result = nullptr) {
  if (result == nullptr) return capi::statusOf(tutti_wait(handle, timeout_seconds));
  tutti_result_t r{};
  r.struct_size = sizeof r;
  r.last_joined_rank = -1;
  const tutti_status_t code = tutti_wait_result(handle, timeout_seconds, &r);
  Status status = capi::statusOf(code);
  if (code == TUTTI_ERR_IN_PROGRESS) return status;
  result->data = r.data;
  result->nbytes = r.nbytes;
  result->shape.assign(r.shape, r.shape + (r.ndim > 0 ? r.ndim : 0));
  result->recv_splits.assign(r.recv_splits, r.recv_splits + (r.recv_splits ? r.nsplits : 0));
  tutti_free(r.recv_splits);
  result->last_joined_rank = r.last_joined_rank;
  return status;
}

inline Status addProcessSet(const std::vector<int>& ranks, int* process_set) {
  return capi::statusOf(
      tutti_add_process_set(ranks.data(), static_cast<int>(ranks.size()), process_set));
}
inline Status removeProcessSet(int process_set) {
  return capi::statusOf(tutti_remove_process_set(process_set));
}
inline int processSetRank(int process_set) { return tutti_process_set_rank(process_set); }
inline int processSetSize(int process_set) { return tutti_process_set_size(process_set); }
inline std::vector<int> processSetRanks(int process_set) {
  int n = 0;
  if (tutti_process_set_ranks(process_set, nullptr, 0, &n) != TUTTI_OK || n <= 0) return {};
  std::vector<int> ranks(static_cast<size_t>(n));
  if (tutti_process_set_ranks(process_set, ranks.data(), n, &n) != TUTTI_OK) return {};
  ranks.resize(static_cast<size_t>(n) < ranks.size() ? static_cast<size_t>(n) : ranks.size());
  return ranks;
}

// The timeline (docs/troubleshooting.md): `path` a directory ("traces/": every rank writes
// traces/rank-N.json) or a file (rank 0 writes it). Local to this rank; starting again with
// the same path keeps the file, another path stops the first. stopTimeline() completes it.
inline Status startTimeline(const std::string& path, bool mark_cycles = false) {
  return capi::statusOf(tutti_start_timeline(path.c_str(), mark_cycles ? 1 : 0));
}
inline Status stopTimeline() { return capi::statusOf(tutti_stop_timeline()); }

// This rank's counters since init, sorted by name (docs/c_api.md, "Counters").
// Empty before init.
inline std::vector<std::pair<std::string, int64_t>> stats() {
  const tutti_stat_t* s = nullptr;
  int n = 0;
  std::vector<std::pair<std::string, int64_t>> out;
  if (tutti_stats(&s, &n) != TUTTI_OK) return out;
  for (int i = 0; i < n; ++i) out.emplace_back(s[i].name, s[i].value);
  return out;
}

// Elastic jobs (docs/elastic.md). isRecoverable: in an elastic job, a failure that leaves
// this process able to go on after shutdown() and init() (which joins the launcher's next
// generation): the job failed under it (a peer died or left, a connection or a deadline
// failed: kAborted, kBackend, kTimeout). Always false outside an elastic job.
inline bool isRecoverable(const Status& status) {
  return tutti_status_recoverable(static_cast<tutti_status_t>(status.code())) != 0;
}
// Whether the launcher has published a newer world than the one this process joined (hosts
// added or removed): then shutdown(), init() and sync the state. kUnsupported outside an
// elastic job.
inline Status hostsUpdated(bool* updated) {
  if (updated == nullptr) return capi::invalidArgument("hostsUpdated: updated is null");
  int u = 0;
  Status s = capi::statusOf(tutti_hosts_updated(&u));
  *updated = u != 0;
  return s;
}
// The generation this process joined last; -1 if none.
inline int64_t elasticGeneration() { return tutti_elastic_generation(); }

inline bool backendBuilt(const std::string& name) { return tutti_backend_built(name.c_str()) != 0; }  // "mpi", "gloo", "nccl"
inline std::string cpuBackend() { return tutti_cpu_backend(); }

inline const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown-dtype";
}

inline int64_t dataTypeSize(DataType dtype) {  // bytes of one element; 0 if not a dtype
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool: return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

}  // namespace tutti
