// The C API (tutti.h): libtutti's whole boundary (the C++ API of tutti.hpp is header-only
// over it). Checks the arguments and calls the runtime (core/api.h). No exception crosses
// it; each failure leaves its detail in a thread-local string for tutti_last_error().
#include "base/common.h"
#include "backends/elastic.h"
#include "core/api.h"
#include "core/c_api_util.h"

#include <tutti/tutti.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

std::string& tutti::capi::lastError() {
  thread_local std::string error;
  return error;
}

namespace {

using tutti::capi::guarded;
using tutti::capi::invalid;

// The value a C caller stored in an enum field or argument. C allows any int there; C++
// must not read an out-of-range value as the enum type, so the bytes are read as an int.
template <typename E>
int rawEnum(const E& value) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int raw = 0;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// Whether options carry the fields added in 0.2 (allocator, release, device), and in 0.3
// (ordered).
bool hasV03(const tutti_op_options_t* o) { return o->struct_size == sizeof(tutti_op_options_t); }
bool hasV02(const tutti_op_options_t* o) {
  return hasV03(o) || o->struct_size == TUTTI_OP_OPTIONS_SIZE_0_2;
}

std::string nameOf(const char* name) { return name ? std::string(name) : std::string(); }

// "allreduce 'name'" for messages, long names shortened.
std::string what(const char* op, const char* name) {
  return std::string(op) + " " + tutti::quotedName(nameOf(name));
}

// A C tensor as a view; false (with last error) when it is malformed.
bool toView(const char* op, const char* name, const tutti_tensor_t* t, tutti::TensorView* view) {
  if (t == nullptr) {
    invalid(what(op, name) + ": tensor pointer is null");
    return false;
  }
  if (t->ndim < 0 || t->ndim > TUTTI_MAX_DIMS) {
    invalid(what(op, name) + ": ndim " + std::to_string(t->ndim) + " outside [0, " +
            std::to_string(TUTTI_MAX_DIMS) + "]");
    return false;
  }
  const int dtype = rawEnum(t->dtype);
  if (!tutti::isValidDataType(dtype)) {
    invalid(what(op, name) + ": dtype " + std::to_string(dtype) + " is not a tutti_dtype_t");
    return false;
  }
  view->data = t->data;
  view->dtype = static_cast<tutti::DataType>(dtype);
  view->shape.assign(t->shape, t->shape + t->ndim);
  return true;
}

// Options may be NULL (defaults); else false (with last error) unless struct_size is this
// header's sizeof (or 0.1's or 0.2's, without the fields added since), the reduce op and
// device exist, and splits/nsplits describe at most one count per rank of the process set
// (checked before the splits are read; the exact count is checked at submit).
bool checkOptions(const char* op, const char* name, const tutti_op_options_t* o) {
  if (o == nullptr) return true;
  if (!hasV02(o) && o->struct_size != TUTTI_OP_OPTIONS_SIZE_0_1) {
    invalid(what(op, name) + ": options struct_size is " + std::to_string(o->struct_size) +
            ", expected sizeof(tutti_op_options_t) = " + std::to_string(sizeof(tutti_op_options_t)) +
            " (call tutti_op_options_init)");
    return false;
  }
  if (!tutti::isValidReduceOp(rawEnum(o->op))) {
    invalid(what(op, name) + ": op " + std::to_string(rawEnum(o->op)) + " is not a tutti_reduce_op_t");
    return false;
  }
  if (hasV02(o) && rawEnum(o->device) != TUTTI_DEVICE_CPU && rawEnum(o->device) != TUTTI_DEVICE_CUDA) {
    invalid(what(op, name) + ": device " + std::to_string(rawEnum(o->device)) + " is not a tutti_device_t");
    return false;
  }
  if (o->splits == nullptr && o->nsplits != 0) {
    invalid(what(op, name) + ": nsplits is " + std::to_string(o->nsplits) + " but splits is NULL");
    return false;
  }
  if (o->splits != nullptr) {
    const int set_size = tutti::api::processSetSize(o->process_set);
    if (set_size <= 0) return true;  // the submission fails: no such set, or not initialized
    if (o->nsplits <= 0 || o->nsplits > set_size) {
      invalid(what(op, name) + ": nsplits is " + std::to_string(o->nsplits) +
              ", expected one split per rank of process set " + std::to_string(o->process_set) +
              " (" + std::to_string(set_size) + " ranks)");
      return false;
    }
  }
  return true;
}

// A timeout must be a number (negative: TUTTI_TIMEOUT_SECONDS). NaN is refused; the handle stays.
bool badTimeout(const char* call, double seconds) {
  if (!std::isnan(seconds)) return false;
  invalid(std::string(call) + ": timeout_seconds is NaN, expected seconds (< 0: TUTTI_TIMEOUT_SECONDS)");
  return true;
}

// The caller's user_data, released (options->release) once the last of the callback and
// allocator made from it is gone: when the op is done, or at once when the call fails.
// Adopted first thing by every call that takes options, so that release runs exactly once.
using UserData = std::shared_ptr<void>;
UserData adopt(const tutti_op_options_t* o) {
  if (o == nullptr || !hasV02(o) || o->release == nullptr) return nullptr;
  return UserData(o->user_data, o->release);
}

tutti::OpOptions toOptions(const tutti_op_options_t* o, const UserData& user) {
  tutti::OpOptions options;
  if (o == nullptr) return options;
  options.op = static_cast<tutti::ReduceOp>(rawEnum(o->op));
  options.prescale = o->prescale;
  options.postscale = o->postscale;
  options.root = o->root;
  options.process_set = o->process_set;
  // checkOptions refused more splits than the set has ranks; no set, no splits read.
  if (o->splits && o->nsplits > 0 && o->nsplits <= tutti::api::processSetSize(o->process_set))
    options.splits.assign(o->splits, o->splits + o->nsplits);
  void* data = o->user_data;
  if (o->callback) {
    tutti_callback_t cb = o->callback;
    options.callback = [cb, data, user](tutti::Handle h, const tutti::Status& s) {
      cb(h, static_cast<tutti_status_t>(s.code()), s.ok() ? nullptr : s.message().c_str(), data);
    };
  }
  options.ordered = hasV03(o) && o->ordered != 0;
  if (hasV02(o) && o->allocator) {
    auto alloc = o->allocator;
    options.allocator = [alloc, data, user](const std::vector<int64_t>& shape) {
      return alloc(shape.data(), static_cast<int>(shape.size()), data);
    };
  }
  return options;
}

// The device the options name (CPU without options or before 0.2).
tutti::DeviceType deviceOf(const tutti_op_options_t* o) {
  return o && hasV02(o) && o->device == TUTTI_DEVICE_CUDA ? tutti::DeviceType::kCuda
                                                           : tutti::DeviceType::kCpu;
}

void flatInto(const void* data, int64_t count, tutti_dtype_t dtype, tutti::TensorView* v) {
  v->data = const_cast<void*>(data);
  v->dtype = static_cast<tutti::DataType>(dtype);
  v->shape.assign(1, count);
}

// A calling thread's name and views for the allreduce entry points, reused call after call
// (the hot path of a training step: the name and shape keep their storage, so that only
// the queue entry is written). Each entry point fills every field it passes on.
struct Reused {
  std::string name;
  tutti::TensorView in, out;
};

tutti::TensorView flat(const void* data, int64_t count, tutti_dtype_t dtype) {
  tutti::TensorView v;
  flatInto(data, count, dtype, &v);
  return v;
}

}  // namespace

extern "C" {

tutti_status_t tutti_init(void) { return guarded([] { return tutti::api::init(); }); }
tutti_status_t tutti_shutdown(void) { return guarded([] { return tutti::api::shutdown(); }); }
int tutti_is_initialized(void) { return tutti::api::isInitialized() ? 1 : 0; }
int tutti_rank(void) { return tutti::api::rank(); }
int tutti_size(void) { return tutti::api::size(); }
int tutti_local_rank(void) { return tutti::api::localRank(); }
int tutti_local_size(void) { return tutti::api::localSize(); }
int tutti_cross_rank(void) { return tutti::api::crossRank(); }
int tutti_cross_size(void) { return tutti::api::crossSize(); }
const char* tutti_last_error(void) { return tutti::capi::lastError().c_str(); }

const char* tutti_status_string(tutti_status_t status) {
  switch (status) {
    case TUTTI_OK: return "ok";
    case TUTTI_ERR_INVALID_ARGUMENT: return "invalid argument";
    case TUTTI_ERR_MISMATCH: return "mismatch across ranks";
    case TUTTI_ERR_TIMEOUT: return "timeout";
    case TUTTI_ERR_ABORTED: return "aborted";
    case TUTTI_ERR_NOT_INITIALIZED: return "not initialized";
    case TUTTI_ERR_BACKEND: return "backend error";
    case TUTTI_ERR_UNSUPPORTED: return "unsupported";
    case TUTTI_ERR_IN_PROGRESS: return "in progress";
    case TUTTI_ERR_JOINED: return "not allowed after join";
    case TUTTI_ERR_DUPLICATE_NAME: return "duplicate name";
    case TUTTI_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

int64_t tutti_dtype_size(tutti_dtype_t dtype) {
  return tutti::isValidDataType(rawEnum(dtype)) ? tutti::dataTypeSize(static_cast<tutti::DataType>(rawEnum(dtype))) : 0;
}

const char* tutti_dtype_name(tutti_dtype_t dtype) {
  return tutti::isValidDataType(rawEnum(dtype)) ? tutti::dataTypeName(static_cast<tutti::DataType>(rawEnum(dtype)))
                                       : "unknown-dtype";
}

int tutti_status_recoverable(tutti_status_t status) {
  return tutti::api::isRecoverable(static_cast<tutti::StatusCode>(status)) ? 1 : 0;
}

tutti_status_t tutti_hosts_updated(int* updated) {
  return guarded([&] {
    if (updated == nullptr)
      return tutti::Status(tutti::StatusCode::kInvalidArgument, "hosts_updated: updated is null");
    bool value = false;
    tutti::Status s = tutti::api::hostsUpdated(&value);
    *updated = value ? 1 : 0;
    return s;
  });
}

int64_t tutti_elastic_generation(void) { return tutti::elasticJoinedGeneration(); }

int tutti_backend_built(const char* name) { return name && tutti::api::backendBuilt(name) ? 1 : 0; }

const char* tutti_cpu_backend(void) {
  static thread_local std::string name;
  name = tutti::api::cpuBackend();
  return name.c_str();
}

void tutti_op_options_init(tutti_op_options_t* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->op = TUTTI_SUM;
  o->prescale = 1.0;
  o->postscale = 1.0;
}

tutti_status_t tutti_allreduce_async(const char* name, const void* input, void* output,
                                     int64_t count, tutti_dtype_t dtype, tutti_reduce_op_t op,
                                     double prescale, double postscale, tutti_handle_t* handle) {
  if (count < 0) return invalid(what("allreduce", name) + ": count " + std::to_string(count) + " is negative");
  if (!tutti::isValidDataType(rawEnum(dtype))) return invalid(what("allreduce", name) + ": dtype " + std::to_string(rawEnum(dtype)) + " is not a tutti_dtype_t");
  if (!tutti::isValidReduceOp(rawEnum(op))) return invalid(what("allreduce", name) + ": op " + std::to_string(rawEnum(op)) + " is not a tutti_reduce_op_t");
  return guarded([&] {
    tutti::OpOptions options;
    options.op = static_cast<tutti::ReduceOp>(op);
    options.prescale = prescale;
    options.postscale = postscale;
    // The hot path of a training step: this thread's name and views are reused, so that
    // only the queue entry allocates.
    thread_local Reused t_reused;  // one thread-local (one TLS look-up per call)
    Reused& r = t_reused;
    r.name.assign(name ? name : "");
    flatInto(input, count, dtype, &r.in);
    flatInto(output, count, dtype, &r.out);
    return tutti::api::allreduceAsync(r.name, r.in, r.out, options, handle);
  });
}

tutti_status_t tutti_broadcast_async(const char* name, void* buffer, int64_t count,
                                     tutti_dtype_t dtype, int root, tutti_handle_t* handle) {
  if (count < 0) return invalid(what("broadcast", name) + ": count " + std::to_string(count) + " is negative");
  if (!tutti::isValidDataType(rawEnum(dtype))) return invalid(what("broadcast", name) + ": dtype " + std::to_string(rawEnum(dtype)) + " is not a tutti_dtype_t");
  return guarded([&] {
    tutti::OpOptions options;
    options.root = root;
    return tutti::api::broadcastAsync(nameOf(name), flat(buffer, count, dtype), options, handle);
  });
}

tutti_status_t tutti_allreduce_tensor_async(const char* name, const tutti_tensor_t* input,
                                            tutti_tensor_t* output,
                                            const tutti_op_options_t* options,
                                            tutti_handle_t* handle) {
  const UserData user = adopt(options);
  thread_local Reused t_reused;
  Reused& r = t_reused;
  if (!toView("allreduce", name, input, &r.in) || !toView("allreduce", name, output, &r.out) ||
      !checkOptions("allreduce", name, options))
    return TUTTI_ERR_INVALID_ARGUMENT;
  r.in.device.type = r.out.device.type = deviceOf(options);
  r.name.assign(name ? name : "");
  return guarded([&] { return tutti::api::allreduceAsync(r.name, r.in, r.out, toOptions(options, user), handle); });
}

tutti_status_t tutti_grouped_allreduce_async(const char* const* names, const tutti_tensor_t* inputs,
                                             tutti_tensor_t* outputs, int ntensors,
                                             const tutti_op_options_t* options,
                                             tutti_handle_t* handle) {
  const UserData user = adopt(options);
  if (ntensors <= 0 || names == nullptr || inputs == nullptr || outputs == nullptr)
    return invalid("grouped_allreduce: expected ntensors > 0 and non-null names, inputs, outputs");
  std::vector<std::string> n;
  std::vector<tutti::TensorView> in(ntensors), out(ntensors);
  for (int i = 0; i < ntensors; ++i) {
    n.push_back(nameOf(names[i]));
    if (!toView("grouped_allreduce", names[i], &inputs[i], &in[i]) ||
        !toView("grouped_allreduce", names[i], &outputs[i], &out[i]))
      return TUTTI_ERR_INVALID_ARGUMENT;
    in[i].device.type = out[i].device.type = deviceOf(options);
  }
  if (!checkOptions("grouped_allreduce", names[0], options)) return TUTTI_ERR_INVALID_ARGUMENT;
  return guarded([&] { return tutti::api::groupedAllreduceAsync(n, in, out, toOptions(options, user), handle); });
}

tutti_status_t tutti_broadcast_tensor_async(const char* name, tutti_tensor_t* buffer,
                                            const tutti_op_options_t* options,
                                            tutti_handle_t* handle) {
  const UserData user = adopt(options);
  tutti::TensorView v;
  if (!toView("broadcast", name, buffer, &v) || !checkOptions("broadcast", name, options))
    return TUTTI_ERR_INVALID_ARGUMENT;
  v.device.type = deviceOf(options);
  return guarded([&] { return tutti::api::broadcastAsync(nameOf(name), v, toOptions(options, user), handle); });
}

#define TUTTI_C_OUTPUT_OP(cname, cppname, label)                                             \
  tutti_status_t cname(const char* name, const tutti_tensor_t* input,                        \
                       const tutti_op_options_t* options, tutti_handle_t* handle) {          \
    const UserData user = adopt(options);                                                    \
    tutti::TensorView v;                                                                     \
    if (!toView(label, name, input, &v) || !checkOptions(label, name, options))              \
      return TUTTI_ERR_INVALID_ARGUMENT;                                                     \
    v.device.type = deviceOf(options);                                                       \
    return guarded([&] {                                                                     \
      return tutti::api::cppname(nameOf(name), v, toOptions(options, user), handle);         \
    });                                                                                      \
  }
TUTTI_C_OUTPUT_OP(tutti_allgather_async, allgatherAsync, "allgather")
TUTTI_C_OUTPUT_OP(tutti_alltoall_async, alltoallAsync, "alltoall")
TUTTI_C_OUTPUT_OP(tutti_reducescatter_async, reducescatterAsync, "reducescatter")
#undef TUTTI_C_OUTPUT_OP

tutti_status_t tutti_barrier(int process_set, double timeout_seconds) {
  if (badTimeout("barrier", timeout_seconds)) return TUTTI_ERR_INVALID_ARGUMENT;
  return guarded([&] {
    tutti::Handle h = 0;
    tutti::Status s = tutti::api::barrierAsync(process_set, &h);
    return s.ok() ? tutti::api::wait(h, timeout_seconds, nullptr) : s;
  });
}

tutti_status_t tutti_join(int process_set, double timeout_seconds, int* last_joined_rank) {
  if (badTimeout("join", timeout_seconds)) return TUTTI_ERR_INVALID_ARGUMENT;
  return guarded([&] {
    tutti::Handle h = 0;
    tutti::Status s = tutti::api::joinAsync(process_set, &h);
    if (!s.ok()) return s;
    tutti::Result result;
    s = tutti::api::wait(h, timeout_seconds, &result);
    if (s.ok() && last_joined_rank) *last_joined_rank = result.last_joined_rank;
    return s;
  });
}

tutti_status_t tutti_barrier_async(int process_set, tutti_handle_t* handle) {
  return guarded([&] { return tutti::api::barrierAsync(process_set, handle); });
}

tutti_status_t tutti_join_async(int process_set, tutti_handle_t* handle) {
  return guarded([&] { return tutti::api::joinAsync(process_set, handle); });
}

tutti_status_t tutti_poll(tutti_handle_t handle, int* done) {
  return guarded([&] {
    bool d = false;
    tutti::Status s = tutti::api::poll(handle, &d);
    if (s.ok() && done) *done = d ? 1 : 0;
    if (s.ok() && !done) return tutti::Status(tutti::StatusCode::kInvalidArgument, "poll: done pointer is null");
    return s;
  });
}

tutti_status_t tutti_wait(tutti_handle_t handle, double timeout_seconds) {
  if (badTimeout("wait", timeout_seconds)) return TUTTI_ERR_INVALID_ARGUMENT;
  return guarded([&] {
    tutti::Result result;
    bool from_allocator = false;
    tutti::Status s = tutti::api::wait(handle, timeout_seconds, &result, &from_allocator);
    // Outputs nobody asked for (tutti_wait on an allgather) are freed here, unless they are
    // the caller's (from its allocator).
    if (s.code() != tutti::StatusCode::kInProgress && !from_allocator) std::free(result.data);
    return s;
  });
}

tutti_status_t tutti_wait_result(tutti_handle_t handle, double timeout_seconds,
                                 tutti_result_t* out) {
  if (badTimeout("wait_result", timeout_seconds)) return TUTTI_ERR_INVALID_ARGUMENT;
  if (out == nullptr) return invalid("wait_result: result pointer is null");
  if (out->struct_size != sizeof(tutti_result_t))
    return invalid("wait_result: result struct_size is " + std::to_string(out->struct_size) +
                   ", expected sizeof(tutti_result_t) = " + std::to_string(sizeof(tutti_result_t)));
  return guarded([&] {
    tutti::Result result;
    bool from_allocator = false;
    tutti::Status s = tutti::api::wait(handle, timeout_seconds, &result, &from_allocator);
    if (s.code() == tutti::StatusCode::kInProgress) return s;
    if (result.shape.size() > TUTTI_MAX_DIMS) {  // submit refuses such shapes; never truncate one
      if (!from_allocator) std::free(result.data);
      return tutti::Status(tutti::StatusCode::kInternal,
                           "wait_result: handle " + std::to_string(handle) + " has a " +
                               std::to_string(result.shape.size()) + "-dimensional result, more than TUTTI_MAX_DIMS");
    }
    out->data = result.data;
    out->nbytes = result.nbytes;
    out->ndim = static_cast<int>(result.shape.size());
    for (size_t i = 0; i < result.shape.size(); ++i) out->shape[i] = result.shape[i];
    out->nsplits = static_cast<int>(result.recv_splits.size());
    out->recv_splits = nullptr;
    if (!result.recv_splits.empty()) {
      out->recv_splits = static_cast<int64_t*>(std::malloc(result.recv_splits.size() * sizeof(int64_t)));
      std::memcpy(out->recv_splits, result.recv_splits.data(), result.recv_splits.size() * sizeof(int64_t));
    }
    out->last_joined_rank = result.last_joined_rank;
    return s;
  });
}

void tutti_free(void* ptr) { std::free(ptr); }

}  // extern "C"
