#include "bench/gloo_baseline.h"

#include "bench/elements.h"
#include "bench/error.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstring>
#include <functional>

namespace tutti {
namespace bench {
namespace {

// A gloo context whose TCP pairs are connected through one collective exchange of their
// addresses (the steps of gloo's connectFullMesh, minus the key-value store):
//   1. create a pair for every peer and collect their addresses, in peer order;
//   2. exchange the address lists over all ranks;
//   3. connect pair i to the address rank i made for this rank.
// device_ and transportContext_ are gloo::Context's protected members, set as
// connectFullMesh sets them.
class ExchangedContext : public gloo::Context {
 public:
  ExchangedContext(int rank, int size) : gloo::Context(rank, size) {}

  void connect(const std::shared_ptr<gloo::transport::Device>& device,
               const ExchangeFn& exchange) {
    auto transport = device->createContext(rank, size);
    transport->setTimeout(getTimeout());
    std::string mine;
    size_t address_bytes = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      std::vector<char> bytes = transport->createPair(peer)->address().bytes();
      address_bytes = bytes.size();
      mine.append(bytes.begin(), bytes.end());
    }
    const std::vector<std::string> all = exchange(mine);
    if (static_cast<int>(all.size()) != size) {
      throwError(StatusCode::kInternal, "tutti-bench: gloo baseline: exchange returned " +
                                            std::to_string(all.size()) + " ranks, expected " +
                                            std::to_string(size));
    }
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      // Rank `peer` listed its pairs in order of ranks other than itself.
      const size_t index = static_cast<size_t>(rank < peer ? rank : rank - 1);
      const std::string& theirs = all[static_cast<size_t>(peer)];
      if (theirs.size() != address_bytes * static_cast<size_t>(size - 1)) {
        throwError(StatusCode::kInternal,
                   "tutti-bench: rank " + std::to_string(rank) + ": gloo baseline: rank " +
                       std::to_string(peer) + " sent " + std::to_string(theirs.size()) +
                       " address bytes, expected " +
                       std::to_string(address_bytes * static_cast<size_t>(size - 1)));
      }
      const char* at = theirs.data() + index * address_bytes;
      transport->getPair(peer)->connect(std::vector<char>(at, at + address_bytes));
    }
    device_ = device;
    transportContext_ = std::move(transport);
  }
};

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
using RawReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn nativeReduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return static_cast<RawReduceFn>(&gloo::min<T>);
    case ReduceOp::kMax: return static_cast<RawReduceFn>(&gloo::max<T>);
    case ReduceOp::kProduct: return static_cast<RawReduceFn>(&gloo::product<T>);
    default: return static_cast<RawReduceFn>(&gloo::sum<T>);  // average: sum + scale
  }
}

// gloo's own templates for the types it has; the bench's own (bench/elements.h)
// for 16-bit floats and bool.
ReduceFn reduceFunction(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: return nativeReduce<uint8_t>(op);
    case DataType::kInt8: return nativeReduce<int8_t>(op);
    case DataType::kUInt16: return nativeReduce<uint16_t>(op);
    case DataType::kInt16: return nativeReduce<int16_t>(op);
    case DataType::kInt32: return nativeReduce<int32_t>(op);
    case DataType::kInt64: return nativeReduce<int64_t>(op);
    case DataType::kFloat32: return nativeReduce<float>(op);
    case DataType::kFloat64: return nativeReduce<double>(op);
    default: break;
  }
  const ReduceOp kernel_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  const int64_t ts = dataTypeSize(dtype);
  return [dtype, kernel_op, ts](void* c, const void* a, const void* b, size_t n) {
    const int64_t count = static_cast<int64_t>(n);
    if (c == a) {
      reduceInto(c, b, count, dtype, kernel_op);
    } else if (c == b) {
      reduceInto(c, a, count, dtype, kernel_op);
    } else {
      std::memcpy(c, a, n * static_cast<size_t>(ts));
      reduceInto(c, b, count, dtype, kernel_op);
    }
  };
}

class GlooBaseline : public Baseline {
 public:
  explicit GlooBaseline(const GlooBaselineConfig& config)
      : rank_(config.rank), size_(config.size) {
    gloo::transport::tcp::attr attr;
    if (!config.iface.empty()) {
      attr.iface = config.iface;
    } else {
      attr.hostname = config.hostname;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<ExchangedContext>(rank_, size_);
    context->setTimeout(std::chrono::milliseconds(
        static_cast<int64_t>(config.timeout_seconds * 1000)));
    context->connect(device, config.exchange);
    context_ = context;
  }

  const char* name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(Workload workload, DataType dtype, ReduceOp op) const override {
    if (workload == Workload::kReducescatter) return false;
    return !(dtype == DataType::kBool && op == ReduceOp::kAverage);
  }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype,
                 ReduceOp op) override {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    const size_t bytes = static_cast<size_t>(count * dataTypeSize(dtype));
    setBuffers(&opts, in, out, bytes, dtype);
    opts.setReduceFunction(reduceFunction(dtype, op));
    gloo::allreduce(opts);
    if (op == ReduceOp::kAverage) scaleInPlace(out, count, dtype, 1.0 / size_);
  }

  void allgather(const void* in, void* out, int64_t count, DataType dtype) override {
    const size_t bytes = static_cast<size_t>(count * dataTypeSize(dtype));
    if (bytes == 0) return;
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<char*>(const_cast<void*>(in)), bytes);
    opts.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(size_));
    gloo::allgather(opts);
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root) override {
    const size_t bytes = static_cast<size_t>(count * dataTypeSize(dtype));
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(buf), bytes);
    opts.setRoot(root);
    gloo::broadcast(opts);
  }

  void alltoall(const void* in, void* out, int64_t count, DataType dtype) override {
    const size_t bytes = static_cast<size_t>(count * dataTypeSize(dtype)) * size_;
    if (bytes == 0) return;
    gloo::AlltoallOptions opts(context_);
    opts.setInput(static_cast<char*>(const_cast<void*>(in)), bytes);
    opts.setOutput(static_cast<char*>(out), bytes);
    gloo::alltoall(opts);
  }

  void reducescatter(const void*, void*, int64_t, DataType, ReduceOp) override {
    throwError(StatusCode::kUnsupported,
               "tutti-bench: the gloo baseline has no reduce-scatter (gloo offers no "
               "options-style reduce_scatter)");
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }

 private:
  // gloo counts elements by the pointer type: give it one of the dtype's width.
  template <typename T>
  static void setTyped(gloo::AllreduceOptions* opts, const void* in, void* out, size_t bytes) {
    T* o = static_cast<T*>(out);
    if (in != out) opts->setInput(static_cast<T*>(const_cast<void*>(in)), bytes / sizeof(T));
    opts->setOutput(o, bytes / sizeof(T));
  }
  static void setBuffers(gloo::AllreduceOptions* opts, const void* in, void* out, size_t bytes,
                         DataType dtype) {
    switch (dataTypeSize(dtype)) {
      case 1: setTyped<uint8_t>(opts, in, out, bytes); break;
      case 2: setTyped<uint16_t>(opts, in, out, bytes); break;
      case 4: setTyped<uint32_t>(opts, in, out, bytes); break;
      default: setTyped<uint64_t>(opts, in, out, bytes); break;
    }
  }

  int rank_, size_;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace

std::unique_ptr<Baseline> makeGlooBaseline(const GlooBaselineConfig& config) {
  return std::make_unique<GlooBaseline>(config);
}

}  // namespace bench
}  // namespace tutti
