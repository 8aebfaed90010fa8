// Data plane on gloo's TCP pairs (gloo_algorithms.h): ring allreduce reducing with
// core/reduce.h (float16/bfloat16 computed in float, bool as or/and), ring allgatherv,
// tree broadcast, dissemination barrier; alltoallv as direct point-to-point messages;
// reducescatter as an allreduce into a persistent scratch buffer, keeping this rank's block.
// Zero-element operations return at once (every member sees the same counts).
#include "backends/gloo/gloo_backend.h"

#include "backends/gloo/gloo_algorithms.h"
#include "base/reduce.h"

#include <cstring>
#include <numeric>

namespace tutti {
namespace detail {
namespace {

constexpr uint32_t kAlltoallTag = 7;

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
  const char* algorithm(OpType op, int64_t) const override {
    switch (op) {
      case OpType::kAllreduce: return "ring";
      case OpType::kAllgather: return "ring";
      case OpType::kBroadcast: return "tree";
      case OpType::kAlltoall: return "direct point-to-point";
      case OpType::kReducescatter: return "ring allreduce, keep own block";
      default: return "dissemination";
    }
  }
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    if (device != DeviceType::kCpu || !isValidDataType(static_cast<int>(dtype))) return false;
    return op == OpType::kAllreduce || op == OpType::kAllgather || op == OpType::kBroadcast ||
           op == OpType::kAlltoall || op == OpType::kReducescatter || op == OpType::kBarrier;
  }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    const std::string what = describe("allreduce", count, dtype) + " op " +
                             reduceOpName(op) + ringPeers(*group_);
    begin(what, deadline);
    const size_t element = static_cast<size_t>(dataTypeSize(dtype));
    if (in != out && count > 0) std::memcpy(out, in, static_cast<size_t>(count) * element);
    ringAllreduce(*group_, out, count, element, reducer(dtype, op), scratch_, what, deadline);
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts,
                  DataType dtype, Deadline deadline) override {
    checkCounts("allgatherv", counts);
    const size_t element = static_cast<size_t>(dataTypeSize(dtype));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const std::string what = describe("allgatherv", total, dtype) + ringPeers(*group_);
    begin(what, deadline);
    std::vector<size_t> bytes(counts.size());
    size_t offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      bytes[r] = static_cast<size_t>(counts[r]) * element;
      if (static_cast<int>(r) < rank()) offset += bytes[r];
    }
    char* mine = static_cast<char*>(out) + offset;
    if (bytes[rank()] > 0 && in != mine) std::memmove(mine, in, bytes[rank()]);
    ringAllgatherv(*group_, out, bytes, what, deadline);
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root,
                 Deadline deadline) override {
    if (root < 0 || root >= size())
      throwError(StatusCode::kInvalidArgument,
                 "gloo broadcast: root " + std::to_string(root) + " is not a rank of a " +
                     "process set of " + std::to_string(size()));
    const std::string what =
        describe("broadcast", count, dtype) + " from root " + std::to_string(root);
    begin(what, deadline);
    treeBroadcast(*group_, buf, static_cast<size_t>(count * dataTypeSize(dtype)), root, what,
                  deadline);
  }

  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    checkCounts("alltoallv send", send_counts);
    checkCounts("alltoallv receive", recv_counts);
    const size_t element = static_cast<size_t>(dataTypeSize(dtype));
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
    const std::string what =
        describe("alltoallv", static_cast<int64_t>(send_offset / element), dtype);
    begin(what, deadline);
    const size_t own = static_cast<size_t>(send_counts[rank()]) * element;
    if (own > 0)
      std::memcpy(static_cast<char*>(out) + self_recv,
                  static_cast<const char*>(in) + self_send, own);
    group_->exchange(what, in, send_offset, sends, out, recv_offset, recvs, kAlltoallTag,
                     deadline);
  }

  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    checkCounts("reducescatter", counts);
    const size_t element = static_cast<size_t>(dataTypeSize(dtype));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
    const std::string what = describe("reducescatter", total, dtype) + " op " +
                             reduceOpName(op) + ringPeers(*group_);
    begin(what, deadline);
    if (total == 0) return;
    // Persistent buffer: grows to the largest reducescatter seen, never shrinks.
    const size_t bytes = static_cast<size_t>(total) * element;
    if (result_.size() < bytes) result_.resize(bytes);
    std::memcpy(result_.data(), in, bytes);
    ringAllreduce(*group_, result_.data(), total, element, reducer(dtype, op), scratch_, what,
                  deadline);
    if (counts[rank()] > 0)
      std::memcpy(out, result_.data() + static_cast<size_t>(before) * element,
                  static_cast<size_t>(counts[rank()]) * element);
  }

  void barrier(Deadline deadline) override {
    begin("barrier", deadline);
    disseminationBarrier(*group_, "barrier", deadline);
  }

  void abort(const std::string& reason) override { group_->abort(reason); }

 private:
  // Fails fast when the group is poisoned or the deadline has passed, even for no data.
  void begin(const std::string& what, Deadline deadline) {
    group_->run(what, deadline, [](std::chrono::milliseconds) {});
  }

  static ReduceFunction reducer(DataType dtype, ReduceOp op) {
    return [dtype, op](void* acc, const void* in, size_t n) {
      reduceInto(acc, in, static_cast<int64_t>(n), dtype, op);
    };
  }

  void checkCounts(const char* op, const std::vector<int64_t>& counts) const {
    bool ok = static_cast<int>(counts.size()) == size();
    for (int64_t c : counts) ok = ok && c >= 0;
    if (!ok)
      throwError(StatusCode::kInvalidArgument,
                 std::string("gloo ") + op + ": expected " + std::to_string(size()) +
                     " non-negative counts (one per member), got " +
                     std::to_string(counts.size()));
  }

  std::unique_ptr<GlooGroup> group_;
  std::vector<char> scratch_;  // one ring chunk
  std::vector<char> result_;   // reducescatter's full reduction
};

}  // namespace

std::unique_ptr<Backend> makeGlooBackend(std::unique_ptr<GlooGroup> group) {
  return std::make_unique<GlooBackend>(std::move(group));
}

}  // namespace detail
}  // namespace tutti
