// Data plane on gloo's algorithms: ring allreduce with a reduction built on core/reduce.h
// (so float16/bfloat16 are computed in float and bool is or/and), ring allgatherv,
// broadcast, barrier; alltoallv as direct point-to-point messages; reducescatter as an
// allreduce into a persistent scratch buffer, keeping this rank's block.
// Zero-element operations return at once (every member sees the same counts).
#include "backends/gloo/gloo_backend.h"

#include "core/reduce.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include <cstring>
#include <numeric>

namespace tutti {
namespace detail {
namespace {

constexpr uint32_t kAlltoallTag = 7;

// Calls f(T{}) with an unsigned type of `bytes` bytes (gloo's algorithms only need the size;
// the reduction function knows the real dtype).
template <typename F>
void withElementType(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: throwError(StatusCode::kInternal, "gloo: unexpected element size " +
                                                   std::to_string(bytes));
  }
}

gloo::AllreduceOptions::Func reduceFunction(DataType dtype, ReduceOp op) {
  const size_t element = static_cast<size_t>(dataTypeBytes(dtype));
  return [dtype, op, element](void* c, const void* a, const void* b, size_t n) {
    const auto count = static_cast<int64_t>(n);
    if (c == a) {
      reduceInto(c, b, count, dtype, op);
    } else if (c == b) {
      reduceInto(c, a, count, dtype, op);  // every op we reduce with is commutative
    } else {
      std::memcpy(c, a, n * element);
      reduceInto(c, b, count, dtype, op);
    }
  };
}

std::string describe(const char* op, int64_t count, DataType dtype) {
  return std::string(op) + " of " + std::to_string(count) + " x " + dataTypeName(dtype);
}

// The ring algorithms wait on these two peers: name them in errors.
std::string ringPeers(const GlooGroup& group) {
  const int n = group.size(), r = group.rank();
  return " [ring: receives from world rank " + std::to_string(group.worldRank((r + n - 1) % n)) +
         ", sends to world rank " + std::to_string(group.worldRank((r + 1) % n)) + "]";
}

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(std::unique_ptr<GlooGroup> group) : group_(std::move(group)) {}

  const char* name() const override { return "gloo"; }
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    if (device != DeviceType::kCpu || !isValidDataType(static_cast<int>(dtype))) return false;
    return op == OpType::kAllreduce || op == OpType::kAllgather || op == OpType::kBroadcast ||
           op == OpType::kAlltoall || op == OpType::kReducescatter || op == OpType::kBarrier;
  }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    group_->run(describe("allreduce", count, dtype) + " op " + reduceOpName(op) +
                    ringPeers(*group_), deadline,
                [&](std::chrono::milliseconds timeout) {
                  allreduceInto(in, out, count, dtype, op, timeout);
                });
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts,
                  DataType dtype, Deadline deadline) override {
    checkCounts("allgatherv", counts);
    const int64_t element = dataTypeBytes(dtype);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    group_->run(describe("allgatherv", total, dtype) + ringPeers(*group_), deadline,
                [&](std::chrono::milliseconds timeout) {
      if (total == 0) return;
      const int64_t mine = counts[rank()] * element;
      if (size() == 1) {
        if (in != out && mine > 0) std::memmove(out, in, mine);
        return;
      }
      std::vector<size_t> bytes(counts.size());
      int64_t offset = 0;
      for (size_t r = 0; r < counts.size(); ++r) {
        bytes[r] = static_cast<size_t>(counts[r] * element);
        if (static_cast<int>(r) < rank()) offset += counts[r] * element;
      }
      char* base = static_cast<char*>(out);
      // gloo primes its output from the input; we do it ourselves (in may alias out).
      if (mine > 0 && in != base + offset) std::memmove(base + offset, in, mine);
      gloo::AllgathervOptions opts(group_->context());
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), bytes);
      opts.setTimeout(timeout);
      gloo::allgatherv(opts);
    });
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root,
                 Deadline deadline) override {
    if (root < 0 || root >= size())
      throwError(StatusCode::kInvalidArgument,
                 "gloo broadcast: root " + std::to_string(root) + " is not a rank of a " +
                     "process set of " + std::to_string(size()));
    group_->run(describe("broadcast", count, dtype) + " from root " + std::to_string(root),
                deadline, [&](std::chrono::milliseconds timeout) {
      if (count == 0 || size() == 1) return;
      gloo::BroadcastOptions opts(group_->context());
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(buf),
                              static_cast<size_t>(count * dataTypeBytes(dtype)));
      opts.setRoot(root);
      opts.setTimeout(timeout);
      gloo::broadcast(opts);
    });
  }

  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    checkCounts("alltoallv send", send_counts);
    checkCounts("alltoallv receive", recv_counts);
    const size_t element = static_cast<size_t>(dataTypeBytes(dtype));
    std::vector<GlooGroup::Transfer> sends, recvs;
    size_t send_offset = 0, recv_offset = 0, self_send = 0, self_recv = 0;
    for (int peer = 0; peer < size(); ++peer) {
      const size_t send_bytes = static_cast<size_t>(send_counts[peer]) * element;
      const size_t recv_bytes = static_cast<size_t>(recv_counts[peer]) * element;
      if (peer == rank()) {
        self_send = send_offset;
        self_recv = recv_offset;
        if (send_bytes != recv_bytes)
          throwError(StatusCode::kInvalidArgument,
                     "gloo alltoallv: rank " + std::to_string(rank()) + " sends itself " +
                         std::to_string(send_counts[peer]) + " elements but expects " +
                         std::to_string(recv_counts[peer]));
      } else {
        sends.push_back({peer, send_offset, send_bytes});
        recvs.push_back({peer, recv_offset, recv_bytes});
      }
      send_offset += send_bytes;
      recv_offset += recv_bytes;
    }
    const size_t own = static_cast<size_t>(send_counts[rank()]) * element;
    if (own > 0)
      std::memcpy(static_cast<char*>(out) + self_recv,
                  static_cast<const char*>(in) + self_send, own);
    group_->exchange(describe("alltoallv", static_cast<int64_t>(send_offset / element), dtype),
                     in, send_offset, sends, out, recv_offset, recvs, kAlltoallTag, deadline);
  }

  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    checkCounts("reducescatter", counts);
    const int64_t element = dataTypeBytes(dtype);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
    group_->run(describe("reducescatter", total, dtype) + " op " + reduceOpName(op) +
                    ringPeers(*group_), deadline,
                [&](std::chrono::milliseconds timeout) {
      if (total == 0) return;
      // Persistent scratch: grows to the largest reducescatter seen, never shrinks.
      if (scratch_.size() < static_cast<size_t>(total * element))
        scratch_.resize(static_cast<size_t>(total * element));
      allreduceInto(in, scratch_.data(), total, dtype, op, timeout);
      if (counts[rank()] > 0)
        std::memcpy(out, scratch_.data() + before * element, counts[rank()] * element);
    });
  }

  void barrier(Deadline deadline) override {
    group_->run("barrier", deadline, [&](std::chrono::milliseconds timeout) {
      if (size() == 1) return;
      gloo::BarrierOptions opts(group_->context());
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

  void abort(const std::string& reason) override { group_->abort(reason); }

 private:
  void checkCounts(const char* op, const std::vector<int64_t>& counts) const {
    bool ok = static_cast<int>(counts.size()) == size();
    for (int64_t c : counts) ok = ok && c >= 0;
    if (!ok)
      throwError(StatusCode::kInvalidArgument,
                 std::string("gloo ") + op + ": expected " + std::to_string(size()) +
                     " non-negative counts (one per member), got " +
                     std::to_string(counts.size()));
  }

  // Runs inside group_->run(); out may equal in.
  void allreduceInto(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                     std::chrono::milliseconds timeout) {
    if (count == 0) return;
    const int64_t element = dataTypeBytes(dtype);
    if (size() == 1) {
      if (in != out) std::memmove(out, in, count * element);
      return;
    }
    withElementType(element, [&](auto type) {
      using T = decltype(type);
      gloo::AllreduceOptions opts(group_->context());
      if (in != out) opts.setInput(static_cast<T*>(const_cast<void*>(in)), count);
      opts.setOutput(static_cast<T*>(out), count);
      opts.setReduceFunction(reduceFunction(dtype, op));
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
    });
  }

  std::unique_ptr<GlooGroup> group_;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<Backend> makeGlooBackend(std::unique_ptr<GlooGroup> group) {
  return std::make_unique<GlooBackend>(std::move(group));
}

}  // namespace detail
}  // namespace tutti
