// tutti.torch._C: the pybind11 bridge between torch tensors and Tutti's C API (tutti/tutti.h).
//
// Like every framework adapter it includes only the C API, so all it takes from libtutti.so
// are C functions (tutti_*): it is compiled with torch's _GLIBCXX_USE_CXX11_ABI, whichever it
// is, and no C++ type crosses into the library (docs/pytorch.md).
//
// With c10d_backend.cc (the torch.distributed backend), the only translation units that
// include torch headers (each one costs about a minute to compile). It stays thin: it turns
// at::Tensor into tutti_tensor_t, starts ops, waits with the GIL released and turns a failed
// status into a Python exception. Handles, in-place copies, autograd and the
// horovod-compatible surface live in the Python package (tutti/torch/*.py), which keeps every
// tensor an op uses alive until the op is done. The one exception is GradReducer,
// DistributedOptimizer's gradient hooks on its common path, which start allreduces from
// autograd without entering Python and keep those gradients alive themselves.
//
// Thread-safety: every function is called with the GIL held, except GradReducer's hooks,
// which run on autograd's thread without it and take it only to raise; the only code that
// runs on Tutti's background thread is an OutputSlot's allocator, which touches no Python
// object.
#include <torch/extension.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#if __has_include(<torch/csrc/dynamo/compiled_autograd.h>)
#define TUTTI_TORCH_COMPILED_AUTOGRAD 1  // torch 2.2 and later
#else
#define TUTTI_TORCH_COMPILED_AUTOGRAD 0
#endif

#include <tutti/tutti.h>

#include "torch_dtype.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace tutti {
namespace torch_ext {
namespace {

using Handle = tutti_handle_t;

// A failed status on its way to Python; the translator below picks the exception class.
class StatusError : public std::runtime_error {
 public:
  StatusError(tutti_status_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  tutti_status_t code() const { return code_; }

 private:
  tutti_status_t code_;
};

// Throws the calling thread's last error for a failed C call.
void check(tutti_status_t status) {
  if (status != TUTTI_OK) throw StatusError(status, tutti_last_error());
}

// Python exception classes, created once at import (module state lives as long as the module).
PyObject* g_tutti_error = nullptr;      // TuttiError(RuntimeError)
PyObject* g_value_error = nullptr;      // TuttiValueError(TuttiError, ValueError)
PyObject* g_duplicate_error = nullptr;  // DuplicateNameError(TuttiValueError)
PyObject* g_timeout_error = nullptr;    // TuttiTimeoutError(TuttiError, TimeoutError)

PyObject* exceptionClassFor(tutti_status_t code) {
  switch (code) {
    case TUTTI_ERR_DUPLICATE_NAME:
      return g_duplicate_error;
    case TUTTI_ERR_INVALID_ARGUMENT:
    case TUTTI_ERR_UNSUPPORTED:
      return g_value_error;
    case TUTTI_ERR_TIMEOUT:
    case TUTTI_ERR_IN_PROGRESS:
      return g_timeout_error;
    default:
      return g_tutti_error;
  }
}

void raiseStatusError(const StatusError& error) {
  PyObject* cls = exceptionClassFor(error.code());
  PyObject* instance = PyObject_CallFunction(cls, "s", error.what());
  if (instance == nullptr) return;  // the failed call already set a Python error
  PyObject* code = PyLong_FromLong(static_cast<long>(error.code()));
  if (code != nullptr) {
    PyObject_SetAttrString(instance, "code", code);
    Py_DECREF(code);
  }
  // An elastic job goes on after it (tutti.torch.elastic.run; docs/elastic.md).
  const bool recoverable = tutti_status_recoverable(error.code()) != 0;
  PyObject_SetAttrString(instance, "recoverable", recoverable ? Py_True : Py_False);
  PyErr_SetObject(cls, instance);
  Py_DECREF(instance);
}

[[noreturn]] void invalid(const std::string& message) {
  throw StatusError(TUTTI_ERR_INVALID_ARGUMENT, "tutti.torch: " + message);
}

// `tensor` as a C tensor into *t; false when it cannot be one as it is (undefined, not
// strided (sparse, ...), not contiguous, a dtype Tutti lacks, too many dimensions). Throws
// nothing (the layout is checked before contiguity, which other layouts may refuse to say):
// GradReducer's hooks call it on autograd's thread.
bool viewOf(const at::Tensor& tensor, tutti_tensor_t* t) {
  std::memset(t, 0, sizeof *t);
  if (!tensor.defined() || tensor.layout() != at::kStrided || !tensor.is_contiguous() ||
      tensor.dim() > TUTTI_MAX_DIMS || !toTuttiDtype(tensor.scalar_type(), &t->dtype)) {
    return false;
  }
  t->data = tensor.data_ptr();
  t->ndim = static_cast<int>(tensor.dim());
  for (int i = 0; i < t->ndim; ++i) t->shape[i] = tensor.size(i);
  return true;
}

// `tensor` as a C tensor; a refusal says which of viewOf's conditions it fails.
tutti_tensor_t toTensor(const at::Tensor& tensor, const char* what) {
  tutti_tensor_t t;
  if (viewOf(tensor, &t)) return t;
  if (!tensor.defined()) invalid(std::string(what) + " is an undefined tensor");
  if (tensor.is_sparse() || !tensor.is_contiguous()) {
    invalid(std::string(what) + " must be a dense contiguous tensor (got layout " +
            c10::str(tensor.layout()) +
            ", contiguous=" + (tensor.is_contiguous() ? "true" : "false") + ")");
  }
  if (!toTuttiDtype(tensor.scalar_type(), &t.dtype)) {
    throw StatusError(TUTTI_ERR_UNSUPPORTED,
                      std::string("tutti.torch: ") + what + ": tensor dtype " +
                          c10::toString(tensor.scalar_type()) + " is not supported (expected " +
                          kSupportedDtypes + ")");
  }
  invalid(std::string(what) + ": shape has " + std::to_string(tensor.dim()) +  // the one left
          " dimensions, expected at most " + std::to_string(TUTTI_MAX_DIMS));
}

tutti_device_t deviceOf(const at::Tensor& tensor) {
  return tensor.is_cuda() ? TUTTI_DEVICE_CUDA : TUTTI_DEVICE_CPU;
}

tutti_op_options_t makeOptions(const at::Tensor& input, int process_set) {
  tutti_op_options_t options;
  tutti_op_options_init(&options);
  options.process_set = process_set;
  options.device = deviceOf(input);
  return options;
}

tutti_op_options_t makeReduceOptions(const at::Tensor& input, int op, double prescale,
                                     double postscale, int process_set) {
  tutti_op_options_t options = makeOptions(input, process_set);
  options.op = static_cast<tutti_reduce_op_t>(op);
  options.prescale = prescale;
  options.postscale = postscale;
  return options;
}

// Receives the output of an op whose size depends on other ranks. The allocator fills it on
// Tutti's background thread; `take()` hands it to Python once the op is done.
class OutputSlot {
 public:
  explicit OutputSlot(at::TensorOptions options) : options_(options) {}

  void* allocate(const std::vector<int64_t>& shape) noexcept {
    try {
      at::Tensor tensor = at::empty(shape, options_);
      std::lock_guard<std::mutex> lock(mutex_);
      tensor_ = tensor;
      if (tensor.numel() > 0) return tensor.data_ptr();
      // An empty output still gets a valid address: null would read as a failed allocation.
      placeholder_ = at::empty({1}, options_);
      return placeholder_.data_ptr();
    } catch (...) {
      return nullptr;  // Tutti reports the failed allocation on the handle
    }
  }

  // The output after a successful wait. Tutti only writes through our allocator, so an
  // output it never asked for has no elements.
  at::Tensor take(const std::vector<int64_t>& shape) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!tensor_.defined()) {
      at::Tensor tensor = at::empty(shape, options_);
      if (tensor.numel() != 0) {
        throw StatusError(TUTTI_ERR_INTERNAL,
                          "tutti.torch: the runtime reported an output of shape " +
                              c10::str(tensor.sizes()) + " without allocating it");
      }
      return tensor;
    }
    if (tensor_.sizes().vec() != shape) {
      throw StatusError(TUTTI_ERR_INTERNAL,
                        "tutti.torch: output allocated with shape " + c10::str(tensor_.sizes()) +
                            " but the runtime reported " + c10::str(at::IntArrayRef(shape)));
    }
    return tensor_;
  }

  // The C API's allocator and release, with a heap-held reference to the slot as user_data.
  static void* allocateFor(const int64_t* shape, int ndim, void* user_data) {
    auto& slot = *static_cast<std::shared_ptr<OutputSlot>*>(user_data);
    return slot->allocate(std::vector<int64_t>(shape, shape + ndim));
  }
  static void release(void* user_data) {
    delete static_cast<std::shared_ptr<OutputSlot>*>(user_data);
  }

 private:
  at::TensorOptions options_;
  std::mutex mutex_;
  at::Tensor tensor_;
  at::Tensor placeholder_;
};

// Attaches a fresh OutputSlot for `input`'s dtype/device to `options`; the C API releases its
// reference once it no longer needs it (also when the submission fails).
std::shared_ptr<OutputSlot> attachSlot(const at::Tensor& input, tutti_op_options_t* options) {
  auto slot = std::make_shared<OutputSlot>(input.options());
  options->user_data = new std::shared_ptr<OutputSlot>(slot);
  options->allocator = &OutputSlot::allocateFor;
  options->release = &OutputSlot::release;
  return slot;
}

Handle allreduceAsync(const std::string& name, const at::Tensor& input, const at::Tensor& output,
                      int op, double prescale, double postscale, int process_set) {
  const tutti_tensor_t in = toTensor(input, "allreduce input");
  tutti_tensor_t out = toTensor(output, "allreduce output");
  const tutti_op_options_t options =
      makeReduceOptions(input, op, prescale, postscale, process_set);
  Handle handle = 0;
  check(tutti_allreduce_tensor_async(name.c_str(), &in, &out, &options, &handle));
  return handle;
}

Handle groupedAllreduceAsync(const std::vector<std::string>& names,
                             const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, int op, double prescale,
                             double postscale, int process_set) {
  if (names.empty() || names.size() != inputs.size() || names.size() != outputs.size()) {
    invalid("grouped_allreduce: got " + std::to_string(names.size()) + " names, " +
            std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
            " outputs; expected the same non-zero count");
  }
  std::vector<const char*> cnames;
  std::vector<tutti_tensor_t> in, out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (deviceOf(inputs[i]) != deviceOf(inputs[0])) {
      invalid("grouped_allreduce '" + names[i] + "': on another kind of device than '" +
              names[0] + "'; one group, one device");
    }
    cnames.push_back(names[i].c_str());
    in.push_back(toTensor(inputs[i], "grouped_allreduce input"));
    out.push_back(toTensor(outputs[i], "grouped_allreduce output"));
  }
  const tutti_op_options_t options =
      makeReduceOptions(inputs[0], op, prescale, postscale, process_set);
  Handle handle = 0;
  check(tutti_grouped_allreduce_async(cnames.data(), in.data(), out.data(),
                                      static_cast<int>(names.size()), &options, &handle));
  return handle;
}

Handle broadcastAsync(const std::string& name, const at::Tensor& buffer, int root,
                      int process_set) {
  tutti_tensor_t t = toTensor(buffer, "broadcast tensor");
  tutti_op_options_t options = makeOptions(buffer, process_set);
  options.root = root;
  Handle handle = 0;
  check(tutti_broadcast_tensor_async(name.c_str(), &t, &options, &handle));
  return handle;
}

using SlotHandle = std::pair<Handle, std::shared_ptr<OutputSlot>>;
using OutputOp = tutti_status_t (*)(const char*, const tutti_tensor_t*,
                                    const tutti_op_options_t*, tutti_handle_t*);

// Starts an op whose output Tutti sizes (allgather, alltoall, reducescatter) into a new slot.
SlotHandle startOutputOp(OutputOp start, const std::string& name, const at::Tensor& input,
                         const char* what, tutti_op_options_t options) {
  const tutti_tensor_t t = toTensor(input, what);  // before the slot: a refusal leaks nothing
  auto slot = attachSlot(input, &options);
  Handle handle = 0;
  check(start(name.c_str(), &t, &options, &handle));
  return {handle, slot};
}

SlotHandle allgatherAsync(const std::string& name, const at::Tensor& input, int process_set) {
  return startOutputOp(tutti_allgather_async, name, input, "allgather input",
                       makeOptions(input, process_set));
}

SlotHandle alltoallAsync(const std::string& name, const at::Tensor& input,
                         const std::vector<int64_t>& splits, int process_set) {
  tutti_op_options_t options = makeOptions(input, process_set);
  options.splits = splits.empty() ? nullptr : splits.data();
  options.nsplits = static_cast<int>(splits.size());
  return startOutputOp(tutti_alltoall_async, name, input, "alltoall input", options);
}

SlotHandle reducescatterAsync(const std::string& name, const at::Tensor& input, int op,
                              double prescale, double postscale, int process_set) {
  return startOutputOp(tutti_reducescatter_async, name, input, "reducescatter input",
                       makeReduceOptions(input, op, prescale, postscale, process_set));
}

Handle barrierAsync(int process_set) {
  Handle handle = 0;
  check(tutti_barrier_async(process_set, &handle));
  return handle;
}

Handle joinAsync(int process_set) {
  Handle handle = 0;
  check(tutti_join_async(process_set, &handle));
  return handle;
}

bool poll(Handle handle) {
  int done = 0;
  check(tutti_poll(handle, &done));
  return done != 0;
}

// Waits for `handle` with the GIL released. Returns (output or None, recv_splits,
// last_joined_rank); the output comes from `slot` for ops that have one.
py::tuple wait(Handle handle, double timeout_seconds, std::shared_ptr<OutputSlot> slot) {
  tutti_result_t result;
  std::memset(&result, 0, sizeof result);
  result.struct_size = sizeof result;
  result.last_joined_rank = -1;
  tutti_status_t status;
  std::string error;
  {
    py::gil_scoped_release release;
    status = tutti_wait_result(handle, timeout_seconds, &result);
    if (status != TUTTI_OK) error = tutti_last_error();  // this thread's, read before any other
  }
  // The output is the slot's (Tutti allocates one only for an op without an allocator, and
  // those here have none); the splits are Tutti's to free.
  std::vector<int64_t> splits;
  if (result.recv_splits != nullptr)
    splits.assign(result.recv_splits, result.recv_splits + result.nsplits);
  tutti_free(result.recv_splits);
  if (!slot) tutti_free(result.data);
  if (status != TUTTI_OK) throw StatusError(status, error);
  py::object output = py::none();
  if (slot) {
    const int ndim = result.ndim > 0 ? result.ndim : 0;
    output = py::cast(slot->take(std::vector<int64_t>(result.shape, result.shape + ndim)));
  }
  return py::make_tuple(output, splits, result.last_joined_rank);
}

// Runs a C call that may wait on the other ranks with the GIL released; throws its failure.
template <typename Call>
void callReleased(Call call) {
  tutti_status_t status;
  std::string error;
  {
    py::gil_scoped_release release;
    status = call();
    if (status != TUTTI_OK) error = tutti_last_error();
  }
  if (status != TUTTI_OK) throw StatusError(status, error);
}

int addProcessSet(const std::vector<int>& ranks) {
  int id = 0;
  callReleased([&] {  // collective over all ranks
    return tutti_add_process_set(ranks.data(), static_cast<int>(ranks.size()), &id);
  });
  return id;
}

void removeProcessSet(int process_set) {
  callReleased([&] { return tutti_remove_process_set(process_set); });
}

std::vector<int> processSetRanks(int process_set) {
  int n = 0;
  if (tutti_process_set_ranks(process_set, nullptr, 0, &n) != TUTTI_OK || n <= 0) return {};
  std::vector<int> ranks(static_cast<size_t>(n));
  if (tutti_process_set_ranks(process_set, ranks.data(), n, &n) != TUTTI_OK) return {};
  if (static_cast<size_t>(n) < ranks.size()) ranks.resize(static_cast<size_t>(n));
  return ranks;
}

void init() {
  callReleased([] { return tutti_init(); });  // may rendezvous with the other ranks
}

void shutdown() {
  callReleased([] { return tutti_shutdown(); });
}

bool hostsUpdated() {
  int updated = 0;
  callReleased([&] { return tutti_hosts_updated(&updated); });  // asks the launcher's server
  return updated != 0;
}

void startTimeline(const std::string& path, bool mark_cycles) {
  check(tutti_start_timeline(path.c_str(), mark_cycles ? 1 : 0));
}

void stopTimeline() { check(tutti_stop_timeline()); }

// This rank's counters since init, sorted by name; empty before init.
std::vector<std::pair<std::string, int64_t>> stats() {
  const tutti_stat_t* s = nullptr;
  int n = 0;
  std::vector<std::pair<std::string, int64_t>> out;
  if (tutti_stats(&s, &n) != TUTTI_OK) return out;
  for (int i = 0; i < n; ++i) out.emplace_back(s[i].name, s[i].value);
  return out;
}

// DistributedOptimizer's gradient hooks on its common path (dense contiguous gradients,
// reduced in place, uncompressed; tutti/torch/optimizer.py picks it). Like DDP's reducer, it
// registers a C++ post hook on each parameter's gradient accumulator, which starts that
// gradient's allreduce on autograd's thread the moment the gradient is final, without
// entering Python: a Python hook cost about 5 us a gradient, this about 1.
//
// A gradient the hook cannot send as it is (sparse, strided, none yet, a dtype Tutti lacks)
// or one still accumulating when step() comes is left to the Python side, which starts what
// is not `started` in synchronize(). The hooks hold the reducer's state weakly: once the optimizer
// is gone they do nothing. Errors reach the caller of backward() as the Python exception the
// Python hook raised (AssertionError for too many passes, TuttiError for a refused op).
class GradReducer {
 public:
  GradReducer(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
              int op, double prescale, double postscale, int process_set, int passes)
      : state_(std::make_shared<State>()) {
    if (params.size() != names.size()) {
      invalid("GradReducer: got " + std::to_string(params.size()) + " parameters and " +
              std::to_string(names.size()) + " names");
    }
    if (passes < 1) {
      invalid("backward_passes_per_step must be >= 1, got " + std::to_string(passes));
    }
    state_->op = op;
    state_->prescale = prescale;
    state_->postscale = postscale;
    state_->process_set = process_set;
    state_->params.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      Param& param = state_->params[i];
      param.tensor = params[i];
      param.name = names[i];
      param.remaining = passes;
      auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
      if (!accumulator) {
        invalid("DistributedOptimizer: parameter '" + names[i] +
                "' is not a leaf tensor that requires grad");
      }
      std::weak_ptr<State> weak = state_;
      auto hook = [weak, i](const torch::autograd::variable_list& outputs,
                            const torch::autograd::variable_list&) {
        if (auto state = weak.lock()) state->ready(i);
        return outputs;
      };
#if TUTTI_TORCH_COMPILED_AUTOGRAD
      // A graph that compiled autograd captures leaves this hook out (instead of refusing
      // it); synchronize() then starts the gradient, after backward rather than during it.
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          hook, [](torch::dynamo::autograd::CompiledNodeArgs&) {}));
#else
      accumulator->add_post_hook(
          std::make_unique<torch::autograd::utils::LambdaPostHook>(hook));
#endif
      accumulators_.push_back(std::move(accumulator));  // the hook lives as long as we do
    }
  }

  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Indices of the parameters whose allreduce is in flight.
  std::vector<int> started() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::vector<int> out;
    for (size_t i = 0; i < state_->params.size(); ++i)
      if (state_->params[i].handle != 0) out.push_back(static_cast<int>(i));
    return out;
  }

  // Whether a hook has fired since the last wait() or reset().
  bool pending() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->pending;
  }

  // Waits for every allreduce in flight (the GIL released), then counts `passes` backward
  // passes again for each parameter. Throws the first failure after waiting for the rest.
  void wait(int passes) {
    std::vector<Handle> handles;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      for (Param& param : state_->params)
        if (param.handle != 0) handles.push_back(param.handle);
    }
    tutti_status_t failed = TUTTI_OK;
    std::string error;
    {
      py::gil_scoped_release release;
      for (Handle handle : handles) {
        const tutti_status_t status = tutti_wait(handle, -1.0);
        if (status != TUTTI_OK && failed == TUTTI_OK) {
          failed = status;
          error = tutti_last_error();
        }
      }
    }
    reset(passes);
    if (failed != TUTTI_OK) throw StatusError(failed, error);
  }

  // Forgets what is in flight without waiting (an elastic reset: the runtime that ran it is
  // gone) and counts `passes` passes again.
  void reset(int passes) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (Param& param : state_->params) {
      param.handle = 0;
      param.grad = at::Tensor();
      param.remaining = passes;
    }
    state_->pending = false;
  }

 private:
  struct Param {
    at::Tensor tensor;
    std::string name;  // the op's name: "allreduce.<parameter name>"
    int remaining = 1;  // backward passes until this gradient is reduced
    Handle handle = 0;  // the allreduce in flight, 0 if none
    at::Tensor grad;    // the gradient it reduces in place, alive until waited for
  };

  struct State {
    std::mutex mutex;
    std::vector<Param> params;
    int op = TUTTI_AVERAGE;
    double prescale = 1.0, postscale = 1.0;
    int process_set = 0;
    bool pending = false;

    // Parameter i's gradient is accumulated (on autograd's thread, the GIL not held).
    void ready(size_t i) {
      bool too_many = false;
      tutti_status_t status = TUTTI_OK;
      std::string error;
      {
        std::lock_guard<std::mutex> lock(mutex);
        pending = true;
        too_many = params[i].remaining <= 0;
        if (!too_many) status = start(params[i], &error);
      }
      if (!too_many && status == TUTTI_OK) return;
      // Raised without the lock: a Python thread may hold the GIL and wait for the lock.
      py::gil_scoped_acquire gil;
      if (too_many) {
        PyErr_SetString(PyExc_AssertionError,
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.");
      } else {
        raiseStatusError(StatusError(status, error));
      }
      python_error python;  // autograd hands it to the caller of backward(), as a Python hook's
      python.persist();
      throw python;
    }

    // Counts a backward pass of `param` and starts its allreduce after the last one; a
    // failure's status, with its message in `error`.
    tutti_status_t start(Param& param, std::string* error) {
      if (--param.remaining > 0) return TUTTI_OK;
      at::Tensor grad = param.tensor.grad();
      tutti_tensor_t t;
      if (!viewOf(grad, &t)) return TUTTI_OK;  // the Python side reduces it in synchronize()
      const tutti_op_options_t options =
          makeReduceOptions(grad, op, prescale, postscale, process_set);
      Handle handle = 0;
      const tutti_status_t status =
          tutti_allreduce_tensor_async(param.name.c_str(), &t, &t, &options, &handle);
      if (status != TUTTI_OK) {
        *error = tutti_last_error();
        return status;
      }
      param.handle = handle;
      param.grad = std::move(grad);
      return TUTTI_OK;
    }
  };

  std::shared_ptr<State> state_;
  std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accumulators_;
};

PyObject* newException(const char* name, PyObject* bases, const char* doc) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  return cls;
}

void defineExceptions(py::module_& m) {
  g_tutti_error = newException("tutti.torch.TuttiError", PyExc_RuntimeError,
                               "A Tutti operation failed; `code` is the tutti_status_t.");
  py::tuple value_bases = py::make_tuple(py::handle(g_tutti_error), py::handle(PyExc_ValueError));
  g_value_error = newException("tutti.torch.TuttiValueError", value_bases.ptr(),
                               "Invalid or unsupported input on this rank.");
  g_duplicate_error = newException("tutti.torch.DuplicateNameError", g_value_error,
                                   "A tensor of that name is already in flight on this rank.");
  py::tuple timeout_bases =
      py::make_tuple(py::handle(g_tutti_error), py::handle(PyExc_TimeoutError));
  g_timeout_error = newException("tutti.torch.TuttiTimeoutError", timeout_bases.ptr(),
                                 "A deadline passed while waiting for an operation.");
  m.attr("TuttiError") = py::handle(g_tutti_error);
  m.attr("TuttiValueError") = py::handle(g_value_error);
  m.attr("DuplicateNameError") = py::handle(g_duplicate_error);
  m.attr("TuttiTimeoutError") = py::handle(g_timeout_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      raiseStatusError(e);
    }
  });
}

}  // namespace
}  // namespace torch_ext
}  // namespace tutti

namespace tutti {
namespace detail {
void defineC10dBackend(py::module& m);  // c10d_backend.cc
}  // namespace detail
}  // namespace tutti

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tutti::torch_ext;
  m.doc() = "Tutti collectives on torch tensors (internal; use tutti.torch)";
  defineExceptions(m);
  tutti::detail::defineC10dBackend(m);

  py::class_<OutputSlot, std::shared_ptr<OutputSlot>>(m, "OutputSlot");

  m.def("init", &init);
  m.def("shutdown", &shutdown);
  m.def("is_initialized", [] { return tutti_is_initialized() != 0; });
  m.def("rank", &tutti_rank);
  m.def("size", &tutti_size);
  m.def("local_rank", &tutti_local_rank);
  m.def("local_size", &tutti_local_size);
  m.def("cross_rank", &tutti_cross_rank);
  m.def("cross_size", &tutti_cross_size);
  m.def("backend_built", [](const std::string& name) { return tutti_backend_built(name.c_str()) != 0; }, py::arg("name"));
  m.def("cpu_backend", [] { return std::string(tutti_cpu_backend()); });
  m.def("start_timeline", &startTimeline, py::arg("path"), py::arg("mark_cycles"));
  m.def("stop_timeline", &stopTimeline);
  m.def("stats", &stats);
  m.def("hosts_updated", &hostsUpdated);
  m.def("elastic_generation", &tutti_elastic_generation);

  m.def("allreduce_async", &allreduceAsync, py::arg("name"), py::arg("input"),
        py::arg("output"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("process_set"));
  m.def("grouped_allreduce_async", &groupedAllreduceAsync, py::arg("names"),
        py::arg("inputs"), py::arg("outputs"), py::arg("op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("process_set"));
  m.def("broadcast_async", &broadcastAsync, py::arg("name"), py::arg("buffer"),
        py::arg("root"), py::arg("process_set"));
  m.def("allgather_async", &allgatherAsync, py::arg("name"), py::arg("input"),
        py::arg("process_set"));
  m.def("alltoall_async", &alltoallAsync, py::arg("name"), py::arg("input"), py::arg("splits"),
        py::arg("process_set"));
  m.def("reducescatter_async", &reducescatterAsync, py::arg("name"), py::arg("input"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("process_set"));
  m.def("barrier_async", &barrierAsync, py::arg("process_set"));
  m.def("join_async", &joinAsync, py::arg("process_set"));
  m.def("poll", &poll, py::arg("handle"));
  m.def("wait", &wait, py::arg("handle"), py::arg("timeout_seconds"), py::arg("slot"));

  py::class_<GradReducer, std::shared_ptr<GradReducer>>(m, "GradReducer")
      .def(py::init<const std::vector<at::Tensor>&, const std::vector<std::string>&, int,
                    double, double, int, int>(),
           py::arg("params"), py::arg("names"), py::arg("op"), py::arg("prescale"),
           py::arg("postscale"), py::arg("process_set"), py::arg("passes"))
      .def("started", &GradReducer::started)
      .def("pending", &GradReducer::pending)
      .def("wait", &GradReducer::wait, py::arg("passes"))
      .def("reset", &GradReducer::reset, py::arg("passes"));

  m.def("add_process_set", &addProcessSet, py::arg("ranks"));
  m.def("remove_process_set", &removeProcessSet, py::arg("process_set"));
  m.def("process_set_rank", &tutti_process_set_rank, py::arg("process_set"));
  m.def("process_set_size", &tutti_process_set_size, py::arg("process_set"));
  m.def("process_set_ranks", &processSetRanks, py::arg("process_set"));

  m.attr("SUM") = static_cast<int>(TUTTI_SUM);
  m.attr("AVERAGE") = static_cast<int>(TUTTI_AVERAGE);
  m.attr("MIN") = static_cast<int>(TUTTI_MIN);
  m.attr("MAX") = static_cast<int>(TUTTI_MAX);
  m.attr("PRODUCT") = static_cast<int>(TUTTI_PRODUCT);
}
