// tutti.tensorflow under XLA (tf.function(jit_compile=True)): XLA kernels for Tutti's ops.
//
// TuttiAllreduce, TuttiGroupedAllreduce and TuttiBroadcast lower to an XLA custom call with a
// side effect (so that XLA neither drops nor merges it) to a typed XLA FFI handler on the host
// platform. The handlers are tutti.jax's (frameworks/jax/csrc/jax_ffi.cc, compiled into this
// library against the FFI headers of the TensorFlow wheel): each submits the op to Tutti and
// returns a future, so that no XLA thread blocks on the network and every rank submits all the
// collectives of a compiled function, whatever order XLA issues them in; Tutti's name-based
// negotiation matches them up, as for the graph ops. Their attributes travel in the custom
// call's backend config (an MLIR dictionary, as the typed FFI reads it).
//
// The wheel's XLA headers include highwayhash's and farmhash's, which the wheel does not ship:
// without them (TUTTI_TF_XLA_LOWERING=0, frameworks/tensorflow/CMakeLists.txt) those
// three ops get the kernel of the others instead.
//
// The kernels are for XLA's CPU compilation device (on GPU, TensorFlow's own message says that
// the ops have no kernel there).
//
// The other ops (allgather and alltoall, whose output shape depends on the other ranks'
// inputs, reducescatter, join and barrier) have an XLA kernel that fails the compilation with
// Tutti's own message: what cannot be compiled, why, and what to do instead. The compilation
// fails the same way on every rank, before any collective of the function runs.
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/op_kernel.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include <string>
#include <vector>

#if TUTTI_TF_XLA_LOWERING
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"

#include "absl/strings/str_format.h"

// The FFI API of the XLA in libtensorflow_cc.so.2, whose registry its CPU compiler looks
// custom-call targets up in. Declared here: xla/ffi/ffi_api.h, which declares it, needs MLIR
// headers that the wheel does not ship.
namespace xla::ffi {
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace xla::ffi

// tutti.jax's handlers (jax_ffi.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(TuttiJaxAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TuttiJaxGroupedAllreduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TuttiJaxBroadcast);
#endif

namespace tutti_tf {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

// The first of an op's tensor names (tensor_name, or tensor_names for the grouped allreduce);
// empty for join and barrier.
std::string firstName(OpKernelConstruction* context) {
  std::string name;
  std::vector<std::string> names;
  if (context->HasAttr("tensor_name")) {
    if (context->GetAttr("tensor_name", &name).ok()) return name;
  } else if (context->HasAttr("tensor_names")) {
    if (context->GetAttr("tensor_names", &names).ok() && !names.empty()) return names[0];
  }
  return name;
}

// What a user sees when a Tutti op cannot be compiled by XLA: the op, its tensor, why, and
// what to do.
std::string notCompilable(const std::string& what, const std::string& name,
                          const std::string& why) {
  std::string op = name.empty() ? what : absl::StrCat(what, " '", name, "'");
  return absl::StrCat(
      "tutti.tensorflow: ", op, " cannot be compiled by XLA (tf.function(jit_compile=True)): ",
      why,
      "; call the collective outside the XLA-compiled function or use jit_compile=False (in "
      "Keras: model.compile(jit_compile=False))");
}

// The XLA kernel of an op that has no lowering: the compilation fails with Tutti's message.
// A plain OpKernel: the XLA compiler runs a kernel's Compute to build the computation.
class NotCompilableOp : public OpKernel {
 public:
  NotCompilableOp(OpKernelConstruction* context, const char* what, const char* why)
      : OpKernel(context), message_(notCompilable(what, firstName(context), why)) {}

  void Compute(OpKernelContext* context) override {
    context->SetStatus(absl::UnimplementedError(message_));
  }

 private:
  std::string message_;
};

// Kernels for XLA's CPU compilation device, registered with TensorFlow's kernel registry
// directly (REGISTER_XLA_OP's registrations reach it only at TensorFlow's first XLA
// compilation, so an op library loaded after that one would have none).
#define TUTTI_XLA_KERNEL(op, Class) \
  REGISTER_KERNEL_BUILDER(Name(op).Device(tensorflow::DEVICE_CPU_XLA_JIT), Class)

constexpr char kOnlyLowered[] =
    "Tutti lowers only allreduce, grouped_allreduce and broadcast to XLA";
constexpr char kShapeFromOthers[] =
    "its output's shape depends on the other ranks' inputs, and XLA needs every shape when "
    "it compiles";

#define TUTTI_NOT_COMPILABLE(Class, what, why)                                        \
  class Class : public NotCompilableOp {                                              \
   public:                                                                            \
    explicit Class(OpKernelConstruction* context) : NotCompilableOp(context, what, why) {} \
  };

TUTTI_NOT_COMPILABLE(AllgatherXlaOp, "allgather", kShapeFromOthers)
TUTTI_NOT_COMPILABLE(AlltoallXlaOp, "alltoall", kShapeFromOthers)
TUTTI_NOT_COMPILABLE(ReducescatterXlaOp, "reducescatter", kOnlyLowered)
TUTTI_NOT_COMPILABLE(JoinXlaOp, "join", kOnlyLowered)
TUTTI_NOT_COMPILABLE(BarrierXlaOp, "barrier", kOnlyLowered)

TUTTI_XLA_KERNEL("TuttiAllgather", AllgatherXlaOp);
TUTTI_XLA_KERNEL("TuttiAlltoall", AlltoallXlaOp);
TUTTI_XLA_KERNEL("TuttiReducescatter", ReducescatterXlaOp);
TUTTI_XLA_KERNEL("TuttiJoin", JoinXlaOp);
TUTTI_XLA_KERNEL("TuttiBarrier", BarrierXlaOp);

#if TUTTI_TF_XLA_LOWERING

using tensorflow::XlaOpKernel;
using tensorflow::XlaOpKernelContext;

constexpr char kAllreduceTarget[] = "tutti_tf_allreduce";
constexpr char kGroupedAllreduceTarget[] = "tutti_tf_grouped_allreduce";
constexpr char kBroadcastTarget[] = "tutti_tf_broadcast";

XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), kAllreduceTarget, "Host", TuttiJaxAllreduce);
XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), kGroupedAllreduceTarget, "Host",
                         TuttiJaxGroupedAllreduce);
XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), kBroadcastTarget, "Host", TuttiJaxBroadcast);

// A string as an MLIR string literal.
std::string mlirString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\0A";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string i64(int64_t v) { return absl::StrCat(v, " : i64"); }
// MLIR wants a float literal with a fraction or an exponent ("1" is an integer).
std::string f64(double v) { return absl::StrCat(absl::StrFormat("%.17e", v), " : f64"); }

// The custom call: a token (an int32 the handlers pass on; the order of Tutti's ops is settled
// by their names, not by XLA) and the operands in, the token and the results out.
std::vector<xla::XlaOp> customCall(XlaOpKernelContext* ctx, const char* target,
                                   const std::vector<xla::XlaOp>& operands,
                                   const std::vector<xla::Shape>& shapes,
                                   const std::string& attrs) {
  xla::XlaBuilder* b = ctx->builder();
  std::vector<xla::XlaOp> args{xla::ConstantR0<int32_t>(b, 0)};
  args.insert(args.end(), operands.begin(), operands.end());
  std::vector<xla::Shape> results{xla::ShapeUtil::MakeShape(xla::S32, {})};
  results.insert(results.end(), shapes.begin(), shapes.end());
  xla::XlaOp call = xla::CustomCall(b, target, args, xla::ShapeUtil::MakeTupleShape(results),
                                    "{" + attrs + "}", /*has_side_effect=*/true,
                                    /*output_operand_aliasing=*/{}, /*literal=*/nullptr,
                                    xla::CustomCallSchedule::SCHEDULE_NONE,
                                    xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
  std::vector<xla::XlaOp> outs;
  for (size_t i = 0; i < shapes.size(); ++i) outs.push_back(xla::GetTupleElement(call, i + 1));
  return outs;
}

// The reduction's attributes, shared by allreduce and grouped_allreduce.
struct Reduction {
  explicit Reduction(OpKernelConstruction* context) {
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set));
    OP_REQUIRES_OK(context, context->GetAttr("reduce_op", &reduce_op));
    OP_REQUIRES_OK(context, context->GetAttr("prescale_factor", &prescale));
    OP_REQUIRES_OK(context, context->GetAttr("postscale_factor", &postscale));
  }
  std::string attrs() const {
    return absl::StrCat("op = ", i64(reduce_op), ", prescale = ", f64(prescale),
                        ", postscale = ", f64(postscale), ", process_set = ", i64(process_set));
  }
  int process_set = 0;
  int reduce_op = 0;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

class AllreduceXlaOp : public XlaOpKernel {
 public:
  explicit AllreduceXlaOp(OpKernelConstruction* context)
      : XlaOpKernel(context), reduction_(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &name_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    auto shape = ctx->InputXlaShape(0);
    OP_REQUIRES_OK(ctx, shape.status());
    std::string attrs = absl::StrCat("name = ", mlirString(name_), ", ", reduction_.attrs());
    ctx->SetOutput(0, customCall(ctx, kAllreduceTarget, {ctx->Input(0)}, {*shape}, attrs)[0]);
  }

 private:
  Reduction reduction_;
  std::string name_;
};

class GroupedAllreduceXlaOp : public XlaOpKernel {
 public:
  explicit GroupedAllreduceXlaOp(OpKernelConstruction* context)
      : XlaOpKernel(context), reduction_(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_names", &names_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    if (n == 0) return;
    // The handler takes the names joined by newlines.
    OP_REQUIRES(ctx, static_cast<int>(names_.size()) == n,
                absl::InvalidArgumentError(absl::StrCat(
                    "tutti.tensorflow: grouped_allreduce under XLA: ", names_.size(),
                    " tensor names for ", n, " tensors (expected one name per tensor)")));
    std::vector<xla::XlaOp> inputs;
    std::vector<xla::Shape> shapes;
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, names_[i].find('\n') == std::string::npos,
                  absl::InvalidArgumentError(absl::StrCat(
                      "tutti.tensorflow: grouped_allreduce under XLA: tensor name ",
                      mlirString(names_[i]), " contains a newline (expected none)")));
      auto shape = ctx->InputXlaShape(i);
      OP_REQUIRES_OK(ctx, shape.status());
      inputs.push_back(ctx->Input(i));
      shapes.push_back(*shape);
    }
    std::string joined;
    for (int i = 0; i < n; ++i) absl::StrAppend(&joined, i ? "\n" : "", names_[i]);
    std::string attrs = absl::StrCat("names = ", mlirString(joined), ", ", reduction_.attrs());
    auto outs = customCall(ctx, kGroupedAllreduceTarget, inputs, shapes, attrs);
    for (int i = 0; i < n; ++i) ctx->SetOutput(i, outs[i]);
  }

 private:
  Reduction reduction_;
  std::vector<std::string> names_;
};

class BroadcastXlaOp : public XlaOpKernel {
 public:
  explicit BroadcastXlaOp(OpKernelConstruction* context) : XlaOpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &name_));
    OP_REQUIRES_OK(context, context->GetAttr("process_set", &process_set_));
    OP_REQUIRES_OK(context, context->GetAttr("root_rank", &root_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    auto shape = ctx->InputXlaShape(0);
    OP_REQUIRES_OK(ctx, shape.status());
    std::string attrs = absl::StrCat("name = ", mlirString(name_), ", root = ", i64(root_),
                                     ", process_set = ", i64(process_set_));
    ctx->SetOutput(0, customCall(ctx, kBroadcastTarget, {ctx->Input(0)}, {*shape}, attrs)[0]);
  }

 private:
  std::string name_;
  int process_set_ = 0;
  int root_ = 0;
};

TUTTI_XLA_KERNEL("TuttiAllreduce", AllreduceXlaOp);
TUTTI_XLA_KERNEL("TuttiGroupedAllreduce", GroupedAllreduceXlaOp);
TUTTI_XLA_KERNEL("TuttiBroadcast", BroadcastXlaOp);

#else  // !TUTTI_TF_XLA_LOWERING

constexpr char kNotBuilt[] =
    "this tutti.tensorflow was built without its XLA lowering (the TensorFlow wheel's XLA "
    "headers include highwayhash's and farmhash's, which the build did not find: install them, "
    "e.g. Debian's libhighwayhash-dev and libfarmhash-dev, and rebuild Tutti)";

TUTTI_NOT_COMPILABLE(AllreduceXlaOp, "allreduce", kNotBuilt)
TUTTI_NOT_COMPILABLE(GroupedAllreduceXlaOp, "grouped_allreduce", kNotBuilt)
TUTTI_NOT_COMPILABLE(BroadcastXlaOp, "broadcast", kNotBuilt)

TUTTI_XLA_KERNEL("TuttiAllreduce", AllreduceXlaOp);
TUTTI_XLA_KERNEL("TuttiGroupedAllreduce", GroupedAllreduceXlaOp);
TUTTI_XLA_KERNEL("TuttiBroadcast", BroadcastXlaOp);

#endif  // TUTTI_TF_XLA_LOWERING

#undef TUTTI_NOT_COMPILABLE
#undef TUTTI_XLA_KERNEL

}  // namespace
}  // namespace tutti_tf
