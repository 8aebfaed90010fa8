// Control plane on its own gloo context (never shares slots with the data plane).
//  gather:    1. every non-root sends its byte count (8 bytes) to group rank 0;
//             2. every non-root sends its bytes; rank 0 receives them into a persistent
//                buffer at offsets from step 1 and splits them in rank order.
//  broadcast: tree broadcast of the length (8 bytes), then of the bytes.
//  allreduceAnd: ring allreduce of uint64 words with a bitwise-AND reduction.
#include "backends/gloo/gloo_algorithms.h"
#include "backends/gloo/gloo_backend.h"

#include <cstring>

namespace tutti {
namespace detail {
namespace {

constexpr uint32_t kGatherSizeTag = 1;
constexpr uint32_t kGatherBytesTag = 2;

class GlooControlPlane : public ControlPlane {
 public:
  explicit GlooControlPlane(std::unique_ptr<GlooGroup> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    group_->run("gather", deadline, [](std::chrono::milliseconds) {});
    const int n = size();
    if (n == 1) return {bytes};
    std::vector<GlooGroup::Transfer> to_root, from_peers;
    if (rank() == 0) {
      sizes_.assign(n, 0);
      for (int peer = 1; peer < n; ++peer)
        from_peers.push_back({peer, peer * sizeof(uint64_t), sizeof(uint64_t)});
    } else {
      sizes_.assign(1, bytes.size());
      to_root.push_back({0, 0, sizeof(uint64_t)});
    }
    group_->exchange("gather (sizes)", sizes_.data(), rank() == 0 ? 0 : sizeof(uint64_t),
                     to_root, sizes_.data(), rank() == 0 ? n * sizeof(uint64_t) : 0,
                     from_peers, kGatherSizeTag, deadline);
    if (rank() != 0) {
      std::vector<GlooGroup::Transfer> send{{0, 0, bytes.size()}};
      group_->exchange("gather (bytes)", bytes.data(), bytes.size(), send, nullptr, 0, {},
                       kGatherBytesTag, deadline);
      return {};
    }
    size_t total = 0;
    from_peers.clear();
    for (int peer = 1; peer < n; ++peer) {
      from_peers.push_back({peer, total, static_cast<size_t>(sizes_[peer])});
      total += sizes_[peer];
    }
    if (buffer_.size() < total) buffer_.resize(total);
    group_->exchange("gather (bytes)", nullptr, 0, {}, buffer_.data(), total, from_peers,
                     kGatherBytesTag, deadline);
    std::vector<std::string> out;
    out.reserve(n);
    out.push_back(bytes);
    for (int peer = 1; peer < n; ++peer)
      out.emplace_back(buffer_.data() + from_peers[peer - 1].offset, sizes_[peer]);
    return out;
  }

  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    group_->run("broadcast", deadline, [](std::chrono::milliseconds) {});
    if (size() == 1) return bytes;
    uint64_t length = rank() == 0 ? bytes.size() : 0;
    treeBroadcast(*group_, &length, sizeof(length), 0, "broadcast (length)", deadline);
    std::string out = rank() == 0 ? bytes : std::string(length, '\0');
    if (length > 0)
      treeBroadcast(*group_, &out[0], length, 0,
                    "broadcast of " + std::to_string(length) + " bytes", deadline);
    return out;
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    const std::string what = "allreduceAnd of " + std::to_string(bits.size()) + " words";
    group_->run(what, deadline, [](std::chrono::milliseconds) {});
    ringAllreduce(*group_, bits.data(), static_cast<int64_t>(bits.size()), sizeof(uint64_t),
                  [](void* acc, const void* in, size_t n) {
                    auto* a = static_cast<uint64_t*>(acc);
                    const auto* b = static_cast<const uint64_t*>(in);
                    for (size_t i = 0; i < n; ++i) a[i] &= b[i];
                  },
                  scratch_, what, deadline);
  }

  void abort(const std::string& reason) override { group_->abort(reason); }

 private:
  std::unique_ptr<GlooGroup> group_;
  std::vector<uint64_t> sizes_;
  std::vector<char> buffer_;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<ControlPlane> makeGlooControlPlane(std::unique_ptr<GlooGroup> group) {
  return std::make_unique<GlooControlPlane>(std::move(group));
}

}  // namespace detail
}  // namespace tutti
