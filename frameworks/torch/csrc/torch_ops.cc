// tutti.torch._C: the pybind11 bridge between torch tensors and the Tutti C++ API.
//
// That API (tutti/tutti.hpp) is header-only over the C API, so all this module takes from
// libtutti.so are C functions (tutti_*): it is compiled with torch's _GLIBCXX_USE_CXX11_ABI,
// whichever it is, and no std:: type crosses into the library (docs/pytorch.md).
//
// With c10d_backend.cc (the torch.distributed backend), the only translation units that
// include torch headers (each one costs about a minute to
// compile). It stays thin: it turns at::Tensor into TensorView, starts ops, waits with the GIL
// released and turns a failed Status into a Python exception. Handles, in-place copies,
// autograd and the horovod-compatible surface live in the Python package (tutti/torch/*.py),
// which keeps every tensor an op uses alive until the op is done.
//
// Thread-safety: every function is called with the GIL held; the only code that runs on
// Tutti's background thread is an OutputAllocator, which touches no Python object.
#include <torch/extension.h>
#include <torch/version.h>

#include <tutti/tutti.hpp>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace tutti {
namespace detail {
namespace {

// A failed Status on its way to Python; the translator below picks the exception class.
class StatusError : public std::runtime_error {
 public:
  StatusError(StatusCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

void check(const Status& status) {
  if (!status.ok()) throw StatusError(status.code(), status.message());
}

// Python exception classes, created once at import (module state lives as long as the module).
PyObject* g_tutti_error = nullptr;      // TuttiError(RuntimeError)
PyObject* g_value_error = nullptr;      // TuttiValueError(TuttiError, ValueError)
PyObject* g_duplicate_error = nullptr;  // DuplicateNameError(TuttiValueError)
PyObject* g_timeout_error = nullptr;    // TuttiTimeoutError(TuttiError, TimeoutError)

PyObject* exceptionClassFor(StatusCode code) {
  switch (code) {
    case StatusCode::kDuplicateName:
      return g_duplicate_error;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnsupported:
      return g_value_error;
    case StatusCode::kTimeout:
    case StatusCode::kInProgress:
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
  const bool recoverable = tutti::isRecoverable(Status(error.code(), ""));
  PyObject_SetAttrString(instance, "recoverable", recoverable ? Py_True : Py_False);
  PyErr_SetObject(cls, instance);
  Py_DECREF(instance);
}

DataType toDataType(at::ScalarType type) {
  switch (type) {
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kBool: return DataType::kBool;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case at::kUInt16: return DataType::kUInt16;  // torch.uint16 exists from PyTorch 2.3
#endif
    default:
      throw StatusError(StatusCode::kUnsupported,
                        std::string("tutti.torch: tensor dtype ") + c10::toString(type) +
                            " is not supported (expected one of uint8, int8, int16, int32, "
                            "int64, float16, bfloat16, float32, float64, bool, and uint16 "
                            "from PyTorch 2.3)");
  }
}

// A view of `tensor`, which must be dense and contiguous (the Python side ensures it).
TensorView toView(const at::Tensor& tensor, const char* what) {
  if (!tensor.defined()) {
    throw StatusError(StatusCode::kInvalidArgument,
                      std::string("tutti.torch: ") + what + " is an undefined tensor");
  }
  if (tensor.is_sparse() || !tensor.is_contiguous()) {
    throw StatusError(StatusCode::kInvalidArgument,
                      std::string("tutti.torch: ") + what +
                          " must be a dense contiguous tensor (got layout " +
                          c10::str(tensor.layout()) + ", contiguous=" +
                          (tensor.is_contiguous() ? "true" : "false") + ")");
  }
  TensorView view;
  view.data = tensor.data_ptr();
  view.dtype = toDataType(tensor.scalar_type());
  view.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  if (tensor.is_cuda()) {
    view.device.type = DeviceType::kCuda;
    view.device.index = tensor.get_device();
  }
  return view;
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
  at::Tensor take(const Result& result) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!tensor_.defined()) {
      at::Tensor tensor = at::empty(result.shape, options_);
      if (tensor.numel() != 0) {
        throw StatusError(StatusCode::kInternal,
                          "tutti.torch: the runtime reported an output of shape " +
                              c10::str(tensor.sizes()) + " without allocating it");
      }
      return tensor;
    }
    if (tensor_.sizes().vec() != result.shape) {
      throw StatusError(StatusCode::kInternal,
                        "tutti.torch: output allocated with shape " + c10::str(tensor_.sizes()) +
                            " but the runtime reported " + c10::str(at::IntArrayRef(result.shape)));
    }
    return tensor_;
  }

 private:
  at::TensorOptions options_;
  std::mutex mutex_;
  at::Tensor tensor_;
  at::Tensor placeholder_;
};

OpOptions makeOptions(int op, double prescale, double postscale, int process_set) {
  OpOptions options;
  options.op = static_cast<ReduceOp>(op);
  options.prescale = prescale;
  options.postscale = postscale;
  options.process_set = process_set;
  return options;
}

// Attaches a fresh OutputSlot for `input`'s dtype/device to `options`.
std::shared_ptr<OutputSlot> attachSlot(const at::Tensor& input, OpOptions* options) {
  auto slot = std::make_shared<OutputSlot>(input.options());
  options->allocator = [slot](const std::vector<int64_t>& shape) {
    return slot->allocate(shape);
  };
  return slot;
}

Handle allreduceAsync(const std::string& name, const at::Tensor& input, const at::Tensor& output,
                      int op, double prescale, double postscale, int process_set) {
  Handle handle = 0;
  check(tutti::allreduceAsync(name, toView(input, "allreduce input"),
                              toView(output, "allreduce output"),
                              makeOptions(op, prescale, postscale, process_set), &handle));
  return handle;
}

Handle groupedAllreduceAsync(const std::vector<std::string>& names,
                             const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, int op, double prescale,
                             double postscale, int process_set) {
  std::vector<TensorView> in_views, out_views;
  for (const auto& t : inputs) in_views.push_back(toView(t, "grouped_allreduce input"));
  for (const auto& t : outputs) out_views.push_back(toView(t, "grouped_allreduce output"));
  Handle handle = 0;
  check(tutti::groupedAllreduceAsync(names, in_views, out_views,
                                     makeOptions(op, prescale, postscale, process_set),
                                     &handle));
  return handle;
}

Handle broadcastAsync(const std::string& name, const at::Tensor& buffer, int root,
                      int process_set) {
  OpOptions options;
  options.root = root;
  options.process_set = process_set;
  Handle handle = 0;
  check(tutti::broadcastAsync(name, toView(buffer, "broadcast tensor"), options, &handle));
  return handle;
}

using SlotHandle = std::pair<Handle, std::shared_ptr<OutputSlot>>;

SlotHandle allgatherAsync(const std::string& name, const at::Tensor& input, int process_set) {
  OpOptions options;
  options.process_set = process_set;
  auto slot = attachSlot(input, &options);
  Handle handle = 0;
  check(tutti::allgatherAsync(name, toView(input, "allgather input"), options, &handle));
  return {handle, slot};
}

SlotHandle alltoallAsync(const std::string& name, const at::Tensor& input,
                         const std::vector<int64_t>& splits, int process_set) {
  OpOptions options;
  options.process_set = process_set;
  options.splits = splits;
  auto slot = attachSlot(input, &options);
  Handle handle = 0;
  check(tutti::alltoallAsync(name, toView(input, "alltoall input"), options, &handle));
  return {handle, slot};
}

SlotHandle reducescatterAsync(const std::string& name, const at::Tensor& input, int op,
                              double prescale, double postscale, int process_set) {
  OpOptions options = makeOptions(op, prescale, postscale, process_set);
  auto slot = attachSlot(input, &options);
  Handle handle = 0;
  check(tutti::reducescatterAsync(name, toView(input, "reducescatter input"), options, &handle));
  return {handle, slot};
}

Handle barrierAsync(int process_set) {
  Handle handle = 0;
  check(tutti::barrierAsync(process_set, &handle));
  return handle;
}

Handle joinAsync(int process_set) {
  Handle handle = 0;
  check(tutti::joinAsync(process_set, &handle));
  return handle;
}

bool poll(Handle handle) {
  bool done = false;
  check(tutti::poll(handle, &done));
  return done;
}

// Waits for `handle` with the GIL released. Returns (output or None, recv_splits,
// last_joined_rank); the output comes from `slot` for ops that have one.
py::tuple wait(Handle handle, double timeout_seconds, std::shared_ptr<OutputSlot> slot) {
  Result result;
  Status status;
  {
    py::gil_scoped_release release;
    status = tutti::wait(handle, timeout_seconds, &result);
  }
  check(status);
  py::object output = py::none();
  if (slot) output = py::cast(slot->take(result));
  return py::make_tuple(output, result.recv_splits, result.last_joined_rank);
}

int addProcessSet(const std::vector<int>& ranks) {
  int id = 0;
  Status status;
  {
    py::gil_scoped_release release;  // collective over all ranks
    status = tutti::addProcessSet(ranks, &id);
  }
  check(status);
  return id;
}

void removeProcessSet(int process_set) {
  Status status;
  {
    py::gil_scoped_release release;
    status = tutti::removeProcessSet(process_set);
  }
  check(status);
}

void init() {
  Status status;
  {
    py::gil_scoped_release release;  // may rendezvous with the other ranks
    status = tutti::init();
  }
  check(status);
}

void shutdown() {
  Status status;
  {
    py::gil_scoped_release release;
    status = tutti::shutdown();
  }
  check(status);
}

bool hostsUpdated() {
  bool updated = false;
  Status status;
  {
    py::gil_scoped_release release;  // asks the launcher's rendezvous server
    status = tutti::hostsUpdated(&updated);
  }
  check(status);
  return updated;
}

void startTimeline(const std::string& path, bool mark_cycles) {
  check(tutti::startTimeline(path, mark_cycles));
}

void stopTimeline() { check(tutti::stopTimeline()); }

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
}  // namespace detail
}  // namespace tutti

namespace tutti {
namespace detail {
void defineC10dBackend(py::module& m);  // c10d_backend.cc
}  // namespace detail
}  // namespace tutti

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tutti::detail;
  m.doc() = "Tutti collectives on torch tensors (internal; use tutti.torch)";
  defineExceptions(m);
  defineC10dBackend(m);

  py::class_<OutputSlot, std::shared_ptr<OutputSlot>>(m, "OutputSlot");

  m.def("init", &init);
  m.def("shutdown", &shutdown);
  m.def("is_initialized", &tutti::isInitialized);
  m.def("rank", &tutti::rank);
  m.def("size", &tutti::size);
  m.def("local_rank", &tutti::localRank);
  m.def("local_size", &tutti::localSize);
  m.def("cross_rank", &tutti::crossRank);
  m.def("cross_size", &tutti::crossSize);
  m.def("backend_built", &tutti::backendBuilt, py::arg("name"));
  m.def("cpu_backend", &tutti::cpuBackend);
  m.def("start_timeline", &startTimeline, py::arg("path"), py::arg("mark_cycles"));
  m.def("stop_timeline", &stopTimeline);
  m.def("stats", &tutti::stats);
  m.def("hosts_updated", &hostsUpdated);
  m.def("elastic_generation", &tutti::elasticGeneration);

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

  m.def("add_process_set", &addProcessSet, py::arg("ranks"));
  m.def("remove_process_set", &removeProcessSet, py::arg("process_set"));
  m.def("process_set_rank", &tutti::processSetRank, py::arg("process_set"));
  m.def("process_set_size", &tutti::processSetSize, py::arg("process_set"));
  m.def("process_set_ranks", &tutti::processSetRanks, py::arg("process_set"));

  m.attr("SUM") = static_cast<int>(tutti::ReduceOp::kSum);
  m.attr("AVERAGE") = static_cast<int>(tutti::ReduceOp::kAverage);
  m.attr("MIN") = static_cast<int>(tutti::ReduceOp::kMin);
  m.attr("MAX") = static_cast<int>(tutti::ReduceOp::kMax);
  m.attr("PRODUCT") = static_cast<int>(tutti::ReduceOp::kProduct);
}
