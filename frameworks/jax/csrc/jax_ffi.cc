// tutti.jax's XLA FFI handlers: Tutti's collectives as XLA custom calls, so that they run
// inside jax.jit. Built against the headers jaxlib ships (jax.ffi.include_dir(), header only);
// they reach libtutti only through its C API (include/tutti/tutti.h).
//
// Every collective's handler is asynchronous (barrier and join block: see there): it submits the op to Tutti and returns an xla::ffi::Future at
// once, without blocking XLA's thread. XLA may issue independent collectives of one jitted
// function in a different order on different ranks; because none of them blocks, every rank
// submits all of them and Tutti's name-based negotiation matches them up (docs/jax.md, "jit
// semantics"). Tutti's completion callback runs on Tutti's thread and must not block, while
// completing an XLA future runs XLA's continuation inline: callbacks therefore only queue the
// completion, and one thread of this library completes the futures.
//
// A failed op (a mismatch across ranks, a timeout, a peer that died) completes its future with
// an error that carries Tutti's message; JAX raises it as a Python exception.
//
// The handler symbols are exported explicitly: the library is built with hidden visibility.
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tutti/tutti.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#define TUTTI_JAX_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---- completing futures off Tutti's thread ----
struct Completion {
  ffi::Promise promise;
  std::optional<std::string> error;  // nullopt: success
};

class Completer {
 public:
  Completer() : thread_([this] { Run(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Post(Completion c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Completion c = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (c.error) {
        c.promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, *c.error));
      } else {
        c.promise.SetAvailable();
      }
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Completion> queue_;
  bool stop_ = false;
  std::thread thread_;
};

Completer& completer() {
  // Never destroyed: a future may complete while the interpreter exits.
  static Completer* c = new Completer();
  return *c;
}

// What one submitted op keeps until Tutti releases it.
struct Pending {
  Pending(std::string op_, std::string name_) : op(std::move(op_)), name(std::move(name_)) {}
  ffi::Promise promise;
  std::string op;    // "allreduce", ...
  std::string name;  // the first tensor's name
  // allgather/alltoall/reducescatter: the output buffer XLA allocated, with its shape.
  void* out = nullptr;
  std::vector<int64_t> out_shape;
  std::string alloc_error;  // set when Tutti's output shape is not the one traced
};

void OnDone(tutti_handle_t, tutti_status_t status, const char* message, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  Completion c{p->promise, std::nullopt};
  if (status != TUTTI_OK) {
    std::string msg = "tutti: " + p->op + " of tensor '" + p->name + "' failed (" +
                      tutti_status_string(status) + ")";
    if (!p->alloc_error.empty()) {
      msg += ": " + p->alloc_error;
    } else if (message && *message) {
      msg += ": " + std::string(message);
    }
    c.error = std::move(msg);
  }
  completer().Post(std::move(c));
}

void Release(void* user_data) { delete static_cast<Pending*>(user_data); }

// The output XLA allocated, if Tutti's output shape is the one traced.
void* Allocate(const int64_t* shape, int ndim, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  std::vector<int64_t> got(shape, shape + ndim);
  if (got != p->out_shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string r = "(";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + ")";
    };
    p->alloc_error = "the output has shape " + str(got) + " but was traced as " +
                     str(p->out_shape) +
                     " (an input's shape changed on another rank without a retrace there)";
    return nullptr;
  }
  // A zero-size output: any non-null pointer will do, nothing is written.
  static char empty;
  return p->out ? p->out : &empty;
}

std::optional<tutti_dtype_t> ToTutti(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return TUTTI_BOOL;
    case ffi::DataType::S8: return TUTTI_INT8;
    case ffi::DataType::U8: return TUTTI_UINT8;
    case ffi::DataType::S16: return TUTTI_INT16;
    case ffi::DataType::U16: return TUTTI_UINT16;
    case ffi::DataType::S32: return TUTTI_INT32;
    case ffi::DataType::S64: return TUTTI_INT64;
    case ffi::DataType::F16: return TUTTI_FLOAT16;
    case ffi::DataType::BF16: return TUTTI_BFLOAT16;
    case ffi::DataType::F32: return TUTTI_FLOAT32;
    case ffi::DataType::F64: return TUTTI_FLOAT64;
    default: return std::nullopt;
  }
}

// A tutti_tensor_t over an XLA buffer (rank 0 becomes shape (1,)).
ffi::Error ToTensor(const std::string& op, std::string_view name, ffi::DataType type,
                    void* data, ffi::Span<const int64_t> dims, tutti_tensor_t* t) {
  auto dtype = ToTutti(type);
  if (!dtype) {
    return ffi::Error::InvalidArgument("tutti: " + op + " of tensor '" + std::string(name) +
                                       "': XLA element type " +
                                       std::to_string(static_cast<int>(type)) +
                                       " has no Tutti dtype");
  }
  if (dims.size() > TUTTI_MAX_DIMS) {
    return ffi::Error::InvalidArgument("tutti: " + op + " of tensor '" + std::string(name) +
                                       "' has " + std::to_string(dims.size()) +
                                       " dimensions; Tutti takes at most " +
                                       std::to_string(TUTTI_MAX_DIMS));
  }
  std::memset(t, 0, sizeof(*t));
  t->dtype = *dtype;
  t->data = data;
  if (dims.size() == 0) {
    t->ndim = 1;
    t->shape[0] = 1;
  } else {
    t->ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) t->shape[i] = dims[i];
  }
  return ffi::Error::Success();
}

// Options with this op's callback; `p` is released by Tutti (or here, when submission fails).
tutti_op_options_t Options(Pending* p, int64_t process_set) {
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.process_set = static_cast<int>(process_set);
  o.callback = OnDone;
  o.user_data = p;
  o.release = Release;
  return o;
}

// The ordering token: an int32 (batched under vmap) each op takes from the previous op of
// the same jitted function and hands to the next, so that XLA issues them in trace order.
void PassToken(const ffi::AnyBuffer&, ffi::Result<ffi::AnyBuffer>& out) {
  if (out->size_bytes()) std::memset(out->untyped_data(), 0, out->size_bytes());
}

// A future that already failed.
ffi::Future Failed(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

// The future of a submitted op, or of its failed submission (Tutti released `p` then).
ffi::Future Submitted(tutti_status_t st, const std::string& op, const std::string& name,
                      ffi::Future future) {
  if (st == TUTTI_OK) return future;
  return Failed(ffi::Error(ffi::ErrorCode::kInternal,
                           "tutti: " + op + " of tensor '" + name + "' failed (" +
                               tutti_status_string(st) + "): " + tutti_last_error()));
}

ffi::Future AllreduceImpl(ffi::AnyBuffer tok, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> tok_out,
                          ffi::Result<ffi::AnyBuffer> y, std::string_view name,
                          int64_t op, double prescale, double postscale, int64_t process_set) {
  PassToken(tok, tok_out);
  tutti_tensor_t in, out;
  if (auto e = ToTensor("allreduce", name, x.element_type(), x.untyped_data(), x.dimensions(),
                        &in);
      e.failure()) {
    return Failed(std::move(e));
  }
  ToTensor("allreduce", name, y->element_type(), y->untyped_data(), y->dimensions(), &out);
  auto* p = new Pending("allreduce", std::string(name));
  ffi::Future future(p->promise);
  tutti_op_options_t o = Options(p, process_set);
  o.op = static_cast<tutti_reduce_op_t>(op);
  o.prescale = prescale;
  o.postscale = postscale;
  tutti_handle_t h = 0;
  std::string n(name);
  return Submitted(tutti_allreduce_tensor_async(n.c_str(), &in, &out, &o, &h), "allreduce", n,
                   std::move(future));
}

// names: the tensors' names joined by '\n'.
ffi::Future GroupedAllreduceImpl(ffi::AnyBuffer tok, ffi::Result<ffi::AnyBuffer> tok_out,
                                 ffi::RemainingArgs args, ffi::RemainingRets rets,
                                 std::string_view names, int64_t op, double prescale,
                                 double postscale, int64_t process_set) {
  PassToken(tok, tok_out);
  std::vector<std::string> ns;
  size_t start = 0;
  for (;;) {
    size_t end = names.find('\n', start);
    ns.emplace_back(names.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  size_t n = args.size();
  if (ns.size() != n || rets.size() != n) {
    return Failed(ffi::Error::InvalidArgument(
        "tutti: grouped_allreduce: " + std::to_string(n) + " inputs, " +
        std::to_string(rets.size()) + " outputs and " + std::to_string(ns.size()) + " names"));
  }
  std::vector<tutti_tensor_t> ins(n), outs(n);
  std::vector<const char*> cnames(n);
  for (size_t i = 0; i < n; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (!a.has_value() || !r.has_value()) {
      return Failed(ffi::Error::Internal("tutti: grouped_allreduce: bad buffer " +
                                         std::to_string(i)));
    }
    if (auto e = ToTensor("grouped_allreduce", ns[i], a->element_type(), a->untyped_data(),
                          a->dimensions(), &ins[i]);
        e.failure()) {
      return Failed(std::move(e));
    }
    ffi::Result<ffi::AnyBuffer> out = *r;
    ToTensor("grouped_allreduce", ns[i], out->element_type(), out->untyped_data(),
             out->dimensions(), &outs[i]);
    cnames[i] = ns[i].c_str();
  }
  auto* p = new Pending("grouped_allreduce", n ? ns[0] : std::string());
  ffi::Future future(p->promise);
  tutti_op_options_t o = Options(p, process_set);
  o.op = static_cast<tutti_reduce_op_t>(op);
  o.prescale = prescale;
  o.postscale = postscale;
  tutti_handle_t h = 0;
  std::string first = n ? ns[0] : std::string();
  return Submitted(tutti_grouped_allreduce_async(cnames.data(), ins.data(), outs.data(),
                                                 static_cast<int>(n), &o, &h),
                   "grouped_allreduce", first, std::move(future));
}

ffi::Future BroadcastImpl(ffi::AnyBuffer tok, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> tok_out,
                          ffi::Result<ffi::AnyBuffer> y, std::string_view name,
                          int64_t root, int64_t process_set) {
  PassToken(tok, tok_out);
  tutti_tensor_t buf;
  if (auto e = ToTensor("broadcast", name, y->element_type(), y->untyped_data(), y->dimensions(),
                        &buf);
      e.failure()) {
    return Failed(std::move(e));
  }
  if (x.size_bytes() && x.untyped_data() != y->untyped_data()) {
    std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  }
  auto* p = new Pending("broadcast", std::string(name));
  ffi::Future future(p->promise);
  tutti_op_options_t o = Options(p, process_set);
  o.root = static_cast<int>(root);
  tutti_handle_t h = 0;
  std::string n(name);
  return Submitted(tutti_broadcast_tensor_async(n.c_str(), &buf, &o, &h), "broadcast", n,
                   std::move(future));
}

// allgather, alltoall, reducescatter: Tutti writes the output into XLA's buffer through the
// allocator, after checking that its shape is the one traced.
enum class Kind { kAllgather, kAlltoall, kReducescatter };

ffi::Future ShapedImpl(Kind kind, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                       std::string_view name, int64_t op, double prescale, double postscale,
                       ffi::Span<const int64_t> splits, int64_t process_set) {
  const char* opname = kind == Kind::kAllgather  ? "allgather"
                       : kind == Kind::kAlltoall ? "alltoall"
                                                 : "reducescatter";
  tutti_tensor_t in;
  if (auto e = ToTensor(opname, name, x.element_type(), x.untyped_data(), x.dimensions(), &in);
      e.failure()) {
    return Failed(std::move(e));
  }
  tutti_tensor_t out_t;
  ToTensor(opname, name, y->element_type(), y->untyped_data(), y->dimensions(), &out_t);
  auto* p = new Pending(opname, std::string(name));
  p->out = y->element_count() ? y->untyped_data() : nullptr;
  p->out_shape.assign(out_t.shape, out_t.shape + out_t.ndim);
  ffi::Future future(p->promise);
  tutti_op_options_t o = Options(p, process_set);
  o.allocator = Allocate;
  o.op = static_cast<tutti_reduce_op_t>(op);
  o.prescale = prescale;
  o.postscale = postscale;
  std::vector<int64_t> sp(splits.begin(), splits.end());
  if (kind == Kind::kAlltoall && !sp.empty()) {
    o.splits = sp.data();
    o.nsplits = static_cast<int>(sp.size());
  }
  tutti_handle_t h = 0;
  std::string n(name);
  tutti_status_t st;
  switch (kind) {
    case Kind::kAllgather: st = tutti_allgather_async(n.c_str(), &in, &o, &h); break;
    case Kind::kAlltoall: st = tutti_alltoall_async(n.c_str(), &in, &o, &h); break;
    default: st = tutti_reducescatter_async(n.c_str(), &in, &o, &h); break;
  }
  return Submitted(st, opname, n, std::move(future));
}

ffi::Future AllgatherImpl(ffi::AnyBuffer tok, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> tok_out,
                          ffi::Result<ffi::AnyBuffer> y, std::string_view name,
                          int64_t process_set) {
  PassToken(tok, tok_out);
  return ShapedImpl(Kind::kAllgather, x, y, name, TUTTI_SUM, 1.0, 1.0, {}, process_set);
}

ffi::Future AlltoallImpl(ffi::AnyBuffer tok, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> tok_out,
                          ffi::Result<ffi::AnyBuffer> y, std::string_view name,
                         ffi::Span<const int64_t> splits, int64_t process_set) {
  PassToken(tok, tok_out);
  return ShapedImpl(Kind::kAlltoall, x, y, name, TUTTI_SUM, 1.0, 1.0, splits, process_set);
}

ffi::Future ReducescatterImpl(ffi::AnyBuffer tok, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> tok_out,
                              ffi::Result<ffi::AnyBuffer> y,
                              std::string_view name, int64_t op, double prescale,
                              double postscale, int64_t process_set) {
  PassToken(tok, tok_out);
  return ShapedImpl(Kind::kReducescatter, x, y, name, op, prescale, postscale, {}, process_set);
}

// barrier and join inside jit: they block XLA's thread until the set is through (no tensor
// to negotiate by name, so nothing for another op to overtake). The ordering token places them
// after the op traced before them and before the op traced after them.
ffi::Error BarrierImpl(ffi::AnyBuffer tok, ffi::Result<ffi::AnyBuffer> tok_out,
                       int64_t process_set, double timeout_seconds) {
  PassToken(tok, tok_out);
  tutti_status_t st = tutti_barrier(static_cast<int>(process_set), timeout_seconds);
  if (st == TUTTI_OK) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("tutti: barrier of process set ") +
                                                   std::to_string(process_set) + " failed (" +
                                                   tutti_status_string(st) +
                                                   "): " + tutti_last_error());
}

ffi::Error JoinImpl(ffi::AnyBuffer tok, ffi::Result<ffi::AnyBuffer> tok_out,
                    ffi::Result<ffi::AnyBuffer> last, int64_t process_set,
                    double timeout_seconds) {
  PassToken(tok, tok_out);
  int last_rank = -1;
  tutti_status_t st = tutti_join(static_cast<int>(process_set), timeout_seconds, &last_rank);
  if (st != TUTTI_OK) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("tutti: join of process set ") +
                                                     std::to_string(process_set) + " failed (" +
                                                     tutti_status_string(st) +
                                                     "): " + tutti_last_error());
  }
  auto* out = static_cast<int32_t*>(last->untyped_data());
  for (size_t i = 0; i < last->element_count(); ++i) out[i] = last_rank;
  return ffi::Error::Success();
}

}  // namespace

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxAllreduce, AllreduceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxGroupedAllreduce, GroupedAllreduceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("names")
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxBroadcast, BroadcastImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("root")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxAllgather, AllgatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxAlltoall, AlltoallImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<ffi::Span<const int64_t>>("splits")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxReducescatter, ReducescatterImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int64_t>("process_set"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxBarrier, BarrierImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("process_set")
                                  .Attr<double>("timeout_seconds"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TuttiJaxJoin, JoinImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("process_set")
                                  .Attr<double>("timeout_seconds"));

// The version of the C API this library was built against, for a sanity check on load.
TUTTI_JAX_EXPORT int tutti_jax_api_version(void) {
  return TUTTI_VERSION_MAJOR * 1000 + TUTTI_VERSION_MINOR;
}

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
