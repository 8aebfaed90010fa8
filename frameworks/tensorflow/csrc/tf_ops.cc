// tutti.tensorflow's op library: TensorFlow asynchronous op kernels over libtutti's C API.
//
// Built with the flags of the TensorFlow wheel it is loaded into (tf.sysconfig, see
// cmake/TuttiTensorFlow.cmake) and loaded with tf.load_op_library. It takes only C symbols
// (tutti_*) from libtutti.so, so no std:: type crosses between the two builds.
//
// Every kernel is an AsyncOpKernel: ComputeAsync submits the op to Tutti with a completion
// callback and returns at once, so no thread of TensorFlow's inter-op pool waits on the
// network. Tutti runs the callback on its own thread, where nothing may block; it only queues
// the op for this library's completion thread, which reads the result (outputs whose size
// depends on other ranks), sets the outputs and calls TensorFlow's `done`.
//
// Every op carries a tensor name (attr tensor_name) into Tutti's negotiation: the Python layer
// sets it inside tf.function (from the graph's tensor name) or leaves it empty in eager mode,
// where Tutti numbers unnamed ops per kind in issue order (docs/c_api.md).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include <tutti/tutti.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tutti_tf {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using Status = absl::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
// absl::Status with a message assembled from its parts (tensorflow::errors::* is deprecated).
namespace errors {
#define TUTTI_TF_ERROR(Name)                                       \
  template <typename... Args>                                      \
  absl::Status Name(const Args&... args) {                         \
    return absl::Name##Error(absl::StrCat(args...));               \
  }
TUTTI_TF_ERROR(InvalidArgument)
TUTTI_TF_ERROR(FailedPrecondition)
TUTTI_TF_ERROR(DeadlineExceeded)
TUTTI_TF_ERROR(Aborted)
TUTTI_TF_ERROR(Unimplemented)
TUTTI_TF_ERROR(Internal)
#undef TUTTI_TF_ERROR
}  // namespace errors

#define TUTTI_TF_TYPES "{uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double, bool}"

// Seconds to wait for the result of an op Tutti has already reported finished.
constexpr double kResultWaitSeconds = 60.0;

bool toTuttiDtype(DataType dtype, tutti_dtype_t* out) {
  switch (dtype) {
    case tensorflow::DT_UINT8: *out = TUTTI_UINT8; return true;
    case tensorflow::DT_INT8: *out = TUTTI_INT8; return true;
    case tensorflow::DT_UINT16: *out = TUTTI_UINT16; return true;
    case tensorflow::DT_INT16: *out = TUTTI_INT16; return true;
    case tensorflow::DT_INT32: *out = TUTTI_INT32; return true;
    case tensorflow::DT_INT64: *out = TUTTI_INT64; return true;
    case tensorflow::DT_HALF: *out = TUTTI_FLOAT16; return true;
    case tensorflow::DT_BFLOAT16: *out = TUTTI_BFLOAT16; return true;
    case tensorflow::DT_FLOAT: *out = TUTTI_FLOAT32; return true;
    case tensorflow::DT_DOUBLE: *out = TUTTI_FLOAT64; return true;
    case tensorflow::DT_BOOL: *out = TUTTI_BOOL; return true;
    default: return false;
  }
}

// Ends the message of an error an elastic job recovers from (tutti_status_recoverable: a peer
// died, the job is being reset). TensorFlow raises an op's error as the tf.errors class of its
// code, from eager ops and from tf.function calls alike, and keeps the message: tutti.tensorflow
// finds this marker in it (tutti_tf_recoverable_marker) and raises HorovodInternalError, on
// which hvd.elastic.run resets (docs/elastic.md).
constexpr const char kRecoverableMarker[] = " [tutti: recoverable in an elastic job]";

// A Tutti status as a TensorFlow error of the class Horovod raised for it.
Status toStatus(tutti_status_t status, const std::string& what, const std::string& message) {
  std::string text = "tutti." + what + ": " + message;
  if (tutti_status_recoverable(status)) text += kRecoverableMarker;
  switch (status) {
    case TUTTI_OK:
      return absl::OkStatus();
    case TUTTI_ERR_INVALID_ARGUMENT:
    case TUTTI_ERR_DUPLICATE_NAME:
      return errors::InvalidArgument(text);
    case TUTTI_ERR_MISMATCH:
    case TUTTI_ERR_NOT_INITIALIZED:
    case TUTTI_ERR_JOINED:
      return errors::FailedPrecondition(text);
    case TUTTI_ERR_TIMEOUT:
    case TUTTI_ERR_IN_PROGRESS:
      return errors::DeadlineExceeded(text);
    case TUTTI_ERR_ABORTED:
      return errors::Aborted(text);
    case TUTTI_ERR_UNSUPPORTED:
      return errors::Unimplemented(text);
    default:
      return errors::Internal(text);
  }
}

// The detail of a failed submission on this thread.
Status submitError(tutti_status_t status, const std::string& what) {
  std::string message = tutti_last_error();
  if (status == TUTTI_ERR_NOT_INITIALIZED) {
    message += " (call hvd.init() before the first collective)";
  }
  if (message.empty()) message = tutti_status_string(status);
  return toStatus(status, what, message);
}

// One op in flight: what its completion needs. Owned by shared pointers held by Tutti's
// user_data (released through `release`) and by the completion queue.
struct Pending {
  OpKernelContext* context = nullptr;
  AsyncOpKernel::DoneCallback done;
  std::string what;  // "allreduce", ...
  std::string name;
  tutti_handle_t handle = 0;
  tutti_status_t status = TUTTI_OK;
  std::string message;
  bool wants_result = false;
  double wait_seconds = kResultWaitSeconds;  // < 0: Tutti's own deadline (join, barrier)
  // Filled by the allocator (outputs whose size depends on other ranks).
  std::mutex mutex;
  DataType dtype = tensorflow::DT_FLOAT;
  bool allocated = false;
  Tensor output;
  Tensor placeholder;  // an empty output still needs an address
  std::vector<int64_t> splits;
  // Runs on the completion thread with the op's result when it succeeded.
  std::function<Status(Pending*, tutti_result_t*)> finish;
};
using PendingPtr = std::shared_ptr<Pending>;

// The thread that completes ops: Tutti's callback queues them here.
class Completer {
 public:
  static Completer& get() {
    static Completer* completer = new Completer();  // never destroyed: lives to process exit
    return *completer;
  }

  void push(PendingPtr pending) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(pending));
    }
    cv_.notify_one();
  }

 private:
  Completer() {
    std::thread([this] { run(); }).detach();
  }

  void run() {
    for (;;) {
      PendingPtr pending;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        pending = std::move(queue_.front());
        queue_.pop_front();
      }
      complete(pending.get());
    }
  }


 public:
  static void complete(Pending* p);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<PendingPtr> queue_;
};

// Join and barrier take no callback: each waits on a thread of its own (they can last as long
// as the slowest rank's training, and must not hold up the completion of other ops).
void waitOnOwnThread(PendingPtr p) {
  std::thread([p] { Completer::complete(p.get()); }).detach();
}

void Completer::complete(Pending* p) {
    Status status;
    tutti_result_t result;
    std::memset(&result, 0, sizeof(result));
    result.struct_size = sizeof(result);
    result.last_joined_rank = -1;
    if (p->status != TUTTI_OK) {
      status = toStatus(p->status, p->what, p->message.empty()
                                                ? std::string(tutti_status_string(p->status))
                                                : p->message);
    } else if (p->wants_result) {
      tutti_status_t st = tutti_wait_result(p->handle, p->wait_seconds, &result);
      if (st != TUTTI_OK) status = toStatus(st, p->what, tutti_last_error());
    }
    if (status.ok() && p->finish) status = p->finish(p, &result);
    if (result.recv_splits != nullptr) tutti_free(result.recv_splits);
    if (!status.ok()) p->context->SetStatus(status);
    auto done = std::move(p->done);
    p->context = nullptr;
    done();
}

void onDone(tutti_handle_t handle, tutti_status_t status, const char* message, void* user) {
  PendingPtr pending = *static_cast<PendingPtr*>(user);
  pending->handle = handle;
  pending->status = status;
  if (message != nullptr) pending->message = message;
  Completer::get().push(std::move(pending));
}

void onRelease(void* user) { delete static_cast<PendingPtr*>(user); }

void* onAllocate(const int64_t* shape, int ndim, void* user) {
  Pending* p = static_cast<PendingPtr*>(user)->get();
  try {
    TensorShape tshape;
    for (int i = 0; i < ndim; ++i) {
      if (!tshape.AddDimWithStatus(shape[i]).ok()) return nullptr;
    }
    std::lock_guard<std::mutex> lock(p->mutex);
    p->output = Tensor(p->dtype, tshape);
    p->allocated = true;
    if (p->output.NumElements() > 0) return const_cast<char*>(p->output.tensor_data().data());
    p->placeholder = Tensor(p->dtype, TensorShape({1}));
    return const_cast<char*>(p->placeholder.tensor_data().data());
  } catch (...) {
    return nullptr;  // Tutti reports the failed allocation on the op
  }
}

Status toView(const Tensor& tensor, const std::string& what, tutti_tensor_t* view) {
  std::memset(view, 0, sizeof(*view));
  if (!toTuttiDtype(tensor.dtype(), &view->dtype)) {
    return errors::Unimplemented("tutti.", what, ": dtype ", tensorflow::DataTypeString(tensor.dtype()),
                                 " is not supported (expected uint8, int8, uint16, int16, int32, "
                                 "int64, float16, bfloat16, float32, float64 or bool)");
  }
  if (tensor.dims() > TUTTI_MAX_DIMS) {
    return errors::InvalidArgument("tutti.", what, ": a tensor of ", tensor.dims(),
                                   " dimensions (at most ", TUTTI_MAX_DIMS, " are supported)");
  }
  view->ndim = tensor.dims();
  for (int i = 0; i < tensor.dims(); ++i) view->shape[i] = tensor.dim_size(i);
  view->data = const_cast<char*>(tensor.tensor_data().data());
  return absl::OkStatus();
}

// The base of every kernel: reads the common attributes and submits with a callback.
class TuttiKernel : public AsyncOpKernel {
 public:
  TuttiKernel(OpKernelConstruction* context, const char* what)
      : AsyncOpKernel(context), what_(what) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
  }

 protected:
  PendingPtr makePending(OpKernelContext* context, DoneCallback done) {
    auto p = std::make_shared<Pending>();
    p->context = context;
    p->done = std::move(done);
    p->what = what_;
    p->name = tensor_name_;
    return p;
  }

  void initOptions(const PendingPtr& p, tutti_op_options_t* options) {
    tutti_op_options_init(options);
    options->process_set = process_set_;
    options->callback = onDone;
    options->release = onRelease;
    options->user_data = new PendingPtr(p);
  }

  // After a submission: on failure Tutti has already released user_data (release ran), and
  // the op ends here.
  void submitted(tutti_status_t status, const PendingPtr& p, OpKernelContext* context) {
    if (status == TUTTI_OK) return;
    context->SetStatus(submitError(status, what_));
    auto done = std::move(p->done);
    done();
  }

  bool checkInit(OpKernelContext* context, const DoneCallback& done) {
    if (tutti_is_initialized()) return true;
    context->SetStatus(errors::FailedPrecondition(
        "tutti.", what_, ": Tutti has not been initialized: call hvd.init() first"));
    done();
    return false;
  }

  const char* name() const { return tensor_name_.c_str(); }

  std::string what_;
  std::string tensor_name_;
  int process_set_ = 0;
};

class AllreduceOp : public TuttiKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* context) : TuttiKernel(context, "allreduce") {
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, context->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(context, context->GetAttr("postscale_factor", &postscale_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!checkInit(context, done)) return;
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, input.shape(), &output), done);
    tutti_tensor_t in, out;
    OP_REQUIRES_OK_ASYNC(context, toView(input, what_, &in), done);
    OP_REQUIRES_OK_ASYNC(context, toView(*output, what_, &out), done);
    PendingPtr p = makePending(context, std::move(done));
    tutti_op_options_t options;
    initOptions(p, &options);
    options.op = static_cast<tutti_reduce_op_t>(reduce_op_);
    options.prescale = prescale_;
    options.postscale = postscale_;
    tutti_handle_t handle = 0;
    submitted(tutti_allreduce_tensor_async(name(), &in, &out, &options, &handle), p, context);
  }

 private:
  int reduce_op_ = TUTTI_SUM;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class GroupedAllreduceOp : public AsyncOpKernel {
 public:
  explicit GroupedAllreduceOp(OpKernelConstruction* context) : AsyncOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_names", &names_));
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, context->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(context, context->GetAttr("postscale_factor", &postscale_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!tutti_is_initialized()) {
      context->SetStatus(errors::FailedPrecondition(
          "tutti.grouped_allreduce: Tutti has not been initialized: call hvd.init() first"));
      done();
      return;
    }
    const int n = context->num_inputs();
    if (n == 0) {
      done();
      return;
    }
    OP_REQUIRES_ASYNC(context, names_.empty() || static_cast<int>(names_.size()) == n,
                      errors::InvalidArgument("tutti.grouped_allreduce: ", names_.size(),
                                              " names for ", n, " tensors"),
                      done);
    std::vector<tutti_tensor_t> ins(n), outs(n);
    std::vector<const char*> names(n, "");
    for (int i = 0; i < n; ++i) {
      const Tensor& input = context->input(i);
      Tensor* output = nullptr;
      OP_REQUIRES_OK_ASYNC(context, context->allocate_output(i, input.shape(), &output), done);
      OP_REQUIRES_OK_ASYNC(context, toView(input, "grouped_allreduce", &ins[i]), done);
      OP_REQUIRES_OK_ASYNC(context, toView(*output, "grouped_allreduce", &outs[i]), done);
      if (!names_.empty()) names[i] = names_[i].c_str();
    }
    auto p = std::make_shared<Pending>();
    p->context = context;
    p->done = std::move(done);
    p->what = "grouped_allreduce";
    tutti_op_options_t options;
    tutti_op_options_init(&options);
    options.process_set = process_set_;
    options.callback = onDone;
    options.release = onRelease;
    options.user_data = new PendingPtr(p);
    options.op = static_cast<tutti_reduce_op_t>(reduce_op_);
    options.prescale = prescale_;
    options.postscale = postscale_;
    tutti_handle_t handle = 0;
    tutti_status_t st = tutti_grouped_allreduce_async(names.data(), ins.data(), outs.data(), n,
                                                      &options, &handle);
    if (st != TUTTI_OK) {
      context->SetStatus(submitError(st, "grouped_allreduce"));
      auto d = std::move(p->done);
      d();
    }
  }

 private:
  std::vector<std::string> names_;
  int process_set_ = 0;
  int reduce_op_ = TUTTI_SUM;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class BroadcastOp : public TuttiKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* context) : TuttiKernel(context, "broadcast") {
    OP_REQUIRES_OK(context, context->GetAttr("root_rank", &root_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!checkInit(context, done)) return;
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, input.shape(), &output), done);
    if (input.TotalBytes() > 0) {
      std::memcpy(const_cast<char*>(output->tensor_data().data()), input.tensor_data().data(),
                  input.TotalBytes());
    }
    tutti_tensor_t buffer;
    OP_REQUIRES_OK_ASYNC(context, toView(*output, what_, &buffer), done);
    PendingPtr p = makePending(context, std::move(done));
    tutti_op_options_t options;
    initOptions(p, &options);
    options.root = root_;
    tutti_handle_t handle = 0;
    submitted(tutti_broadcast_tensor_async(name(), &buffer, &options, &handle), p, context);
  }

 private:
  int root_ = 0;
};

// The output of an op whose size depends on other ranks, from the allocator's tensor.
Status setAllocatedOutput(Pending* p, const tutti_result_t* result, int index) {
  std::lock_guard<std::mutex> lock(p->mutex);
  if (!p->allocated) {
    TensorShape shape;
    for (int i = 0; i < result->ndim; ++i) shape.AddDim(result->shape[i]);
    if (shape.num_elements() != 0) {
      return errors::Internal("tutti.", p->what, ": the runtime reported an output of shape ",
                              shape.DebugString(), " without allocating it");
    }
    p->output = Tensor(p->dtype, shape);
  }
  p->context->set_output(index, p->output);
  return absl::OkStatus();
}

class AllgatherOp : public TuttiKernel {
 public:
  explicit AllgatherOp(OpKernelConstruction* context) : TuttiKernel(context, "allgather") {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!checkInit(context, done)) return;
    const Tensor& input = context->input(0);
    OP_REQUIRES_ASYNC(context, input.dims() >= 1,
                      errors::InvalidArgument("tutti.allgather: the tensor must have at least "
                                              "one dimension (got a scalar)"),
                      done);
    tutti_tensor_t in;
    OP_REQUIRES_OK_ASYNC(context, toView(input, what_, &in), done);
    PendingPtr p = makePending(context, std::move(done));
    p->dtype = input.dtype();
    p->wants_result = true;
    p->finish = [](Pending* q, tutti_result_t* r) { return setAllocatedOutput(q, r, 0); };
    tutti_op_options_t options;
    initOptions(p, &options);
    options.allocator = onAllocate;
    tutti_handle_t handle = 0;
    submitted(tutti_allgather_async(name(), &in, &options, &handle), p, context);
  }
};

class ReducescatterOp : public TuttiKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* context)
      : TuttiKernel(context, "reducescatter") {
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(context, context->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(context, context->GetAttr("postscale_factor", &postscale_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!checkInit(context, done)) return;
    const Tensor& input = context->input(0);
    OP_REQUIRES_ASYNC(context, input.dims() >= 1,
                      errors::InvalidArgument("tutti.reducescatter: the tensor must have at "
                                              "least one dimension (got a scalar)"),
                      done);
    tutti_tensor_t in;
    OP_REQUIRES_OK_ASYNC(context, toView(input, what_, &in), done);
    PendingPtr p = makePending(context, std::move(done));
    p->dtype = input.dtype();
    p->wants_result = true;
    p->finish = [](Pending* q, tutti_result_t* r) { return setAllocatedOutput(q, r, 0); };
    tutti_op_options_t options;
    initOptions(p, &options);
    options.allocator = onAllocate;
    options.op = static_cast<tutti_reduce_op_t>(reduce_op_);
    options.prescale = prescale_;
    options.postscale = postscale_;
    tutti_handle_t handle = 0;
    submitted(tutti_reducescatter_async(name(), &in, &options, &handle), p, context);
  }

 private:
  int reduce_op_ = TUTTI_SUM;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class AlltoallOp : public TuttiKernel {
 public:
  explicit AlltoallOp(OpKernelConstruction* context) : TuttiKernel(context, "alltoall") {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!checkInit(context, done)) return;
    const Tensor& input = context->input(0);
    const Tensor& splits = context->input(1);
    OP_REQUIRES_ASYNC(context, input.dims() >= 1,
                      errors::InvalidArgument("tutti.alltoall: the tensor must have at least "
                                              "one dimension (got a scalar)"),
                      done);
    OP_REQUIRES_ASYNC(context, splits.dims() == 1,
                      errors::InvalidArgument("tutti.alltoall: splits must be a vector (got "
                                              "shape ", splits.shape().DebugString(), ")"),
                      done);
    // The splits are checked here too, so that every rank reports bad ones as
    // InvalidArgument at once, whatever the other ranks are doing by then.
    const int set_size = tutti_process_set_size(process_set_);
    auto flat = splits.flat<int32_t>();
    if (set_size > 0) {
      const int64_t rows = input.dim_size(0);
      if (flat.size() == 0) {
        OP_REQUIRES_ASYNC(context, rows % set_size == 0,
                          errors::InvalidArgument("tutti.alltoall: alltoall '", tensor_name_,
                                                  "': first dimension ", rows,
                                                  " does not split evenly over ", set_size,
                                                  " ranks; pass splits"),
                          done);
      } else {
        int64_t sum = 0;
        for (int64_t i = 0; i < flat.size(); ++i) sum += flat(i);
        OP_REQUIRES_ASYNC(context, flat.size() == set_size && sum == rows,
                          errors::InvalidArgument("tutti.alltoall: alltoall '", tensor_name_,
                                                  "': ", flat.size(), " splits summing to ", sum,
                                                  " for a first dimension of ", rows, " over ",
                                                  set_size, " ranks (expected ", set_size,
                                                  " splits summing to ", rows, ")"),
                          done);
      }
    }
    tutti_tensor_t in;
    OP_REQUIRES_OK_ASYNC(context, toView(input, what_, &in), done);
    PendingPtr p = makePending(context, std::move(done));
    p->dtype = input.dtype();
    p->wants_result = true;
    for (int64_t i = 0; i < flat.size(); ++i) p->splits.push_back(flat(i));
    p->finish = [](Pending* q, tutti_result_t* r) {
      Status status = setAllocatedOutput(q, r, 0);
      if (!status.ok()) return status;
      Tensor* received = nullptr;
      status = q->context->allocate_output(1, TensorShape({r->nsplits}), &received);
      if (!status.ok()) return status;
      auto out = received->flat<int32_t>();
      for (int i = 0; i < r->nsplits; ++i) out(i) = static_cast<int32_t>(r->recv_splits[i]);
      return absl::OkStatus();
    };
    tutti_op_options_t options;
    initOptions(p, &options);
    options.allocator = onAllocate;
    if (!p->splits.empty()) {
      options.splits = p->splits.data();
      options.nsplits = static_cast<int>(p->splits.size());
    }
    tutti_handle_t handle = 0;
    submitted(tutti_alltoall_async(name(), &in, &options, &handle), p, context);
  }
};

class JoinOp : public AsyncOpKernel {
 public:
  explicit JoinOp(OpKernelConstruction* context) : AsyncOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!tutti_is_initialized()) {
      context->SetStatus(errors::FailedPrecondition(
          "tutti.join: Tutti has not been initialized: call hvd.init() first"));
      done();
      return;
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(context, context->allocate_output(0, TensorShape({}), &output), done);
    auto p = std::make_shared<Pending>();
    p->context = context;
    p->done = std::move(done);
    p->what = "join";
    p->wants_result = true;
    p->finish = [](Pending* q, tutti_result_t* r) {
      q->context->mutable_output(0)->scalar<int32_t>()() = r->last_joined_rank;
      return absl::OkStatus();
    };
    // The async join and barrier take no options: the completion thread waits on their handle.
    tutti_handle_t handle = 0;
    tutti_status_t st = tutti_join_async(process_set_, &handle);
    if (st != TUTTI_OK) {
      context->SetStatus(submitError(st, "join"));
      auto d = std::move(p->done);
      d();
      return;
    }
    p->handle = handle;
    p->wait_seconds = -1.0;
    waitOnOwnThread(p);
  }

 private:
  int process_set_ = 0;
};

class BarrierOp : public AsyncOpKernel {
 public:
  explicit BarrierOp(OpKernelConstruction* context) : AsyncOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
  }

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    if (!tutti_is_initialized()) {
      context->SetStatus(errors::FailedPrecondition(
          "tutti.barrier: Tutti has not been initialized: call hvd.init() first"));
      done();
      return;
    }
    auto p = std::make_shared<Pending>();
    p->context = context;
    p->done = std::move(done);
    p->what = "barrier";
    p->wants_result = true;
    tutti_handle_t handle = 0;
    tutti_status_t st = tutti_barrier_async(process_set_, &handle);
    if (st != TUTTI_OK) {
      context->SetStatus(submitError(st, "barrier"));
      auto d = std::move(p->done);
      d();
      return;
    }
    p->handle = handle;
    p->wait_seconds = -1.0;
    waitOnOwnThread(p);
  }

 private:
  int process_set_ = 0;
};

}  // namespace

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TuttiAllreduce")
    .Attr("T: " TUTTI_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("process_set: int = 0")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("TuttiGroupedAllreduce")
    .Attr("T: list(" TUTTI_TF_TYPES ") >= 0")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("process_set: int = 0")
    .Attr("tensor_names: list(string) = []")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

REGISTER_OP("TuttiBroadcast")
    .Attr("T: " TUTTI_TF_TYPES)
    .Attr("root_rank: int")
    .Attr("process_set: int = 0")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

// The first dimension of the output depends on the other ranks.
Status firstDimUnknown(InferenceContext* c) {
  ShapeHandle output;
  TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
  c->set_output(0, output);
  return absl::OkStatus();
}

REGISTER_OP("TuttiAllgather")
    .Attr("T: " TUTTI_TF_TYPES)
    .Attr("process_set: int = 0")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknown);

REGISTER_OP("TuttiReducescatter")
    .Attr("T: " TUTTI_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("process_set: int = 0")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(firstDimUnknown);

REGISTER_OP("TuttiAlltoall")
    .Attr("T: " TUTTI_TF_TYPES)
    .Attr("process_set: int = 0")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(firstDimUnknown(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("TuttiJoin")
    .Attr("process_set: int = 0")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TuttiBarrier")
    .Attr("process_set: int = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("TuttiAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("TuttiGroupedAllreduce").Device(tensorflow::DEVICE_CPU),
                        GroupedAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("TuttiBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("TuttiAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("TuttiReducescatter").Device(tensorflow::DEVICE_CPU),
                        ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("TuttiAlltoall").Device(tensorflow::DEVICE_CPU).HostMemory("splits"),
                        AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("TuttiJoin").Device(tensorflow::DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("TuttiBarrier").Device(tensorflow::DEVICE_CPU), BarrierOp);

}  // namespace tutti_tf

// The TensorFlow version the library was compiled against, for the import-time check (the
// wheel's headers leave TF_VERSION_STRING undefined: the build passes the probed version).
extern "C" __attribute__((visibility("default"))) const char* tutti_tf_built_version() {
  return TUTTI_TF_BUILT_VERSION;
}

// The marker that ends the message of a recoverable error (kRecoverableMarker).
extern "C" __attribute__((visibility("default"))) const char* tutti_tf_recoverable_marker() {
  return tutti_tf::kRecoverableMarker;
}
