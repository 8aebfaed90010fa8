// Hierarchical allreduce, per call while on (every member takes the same path: all switch
// at the same point):
//   1. reduce-scatter inside the host over shm: local member l gets slice l of the host's
//      reduction (slices split the tensor evenly, 64-byte aligned);
//   2. allreduce of slice l across hosts among the members with local index l (the
//      transport's backend over that sub-group: one rank per host, in parallel for every l);
//   3. allgather of the slices inside the host over shm, into the output.
// Each host sends (hosts - 1)/hosts of the tensor twice over the network in all, instead
// of once per member. Slices live in one persistent buffer.
// Hierarchical allgatherv, while on (fixed at set creation):
//   1. allgatherv across hosts among the members with local index l, of their own blocks;
//   2. allgatherv inside the host over shm of what each local index now holds;
//   3. a copy of every block to its place in set-rank order (hosts may be interleaved).
// Each host receives every other host's blocks once instead of once per member. Both
// steps' results live in persistent buffers.
// A failure in any step aborts every sub-group, so that the members still waiting fail fast.
#include "backends/hierarchical/hier_backend.h"

#include "backends/shm/shm_backend.h"
#include "base/logging.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tutti {
namespace {

class HierarchicalBackend : public Backend {
 public:
  HierarchicalBackend(detail::HostLayout layout, Backend& flat,
                      std::unique_ptr<ControlPlane> local_control,
                      std::unique_ptr<Backend> local, std::unique_ptr<Backend> cross, bool on,
                      bool allgather)
      : layout_(std::move(layout)),
        flat_(flat),
        local_control_(std::move(local_control)),
        local_(std::move(local)),
        cross_(std::move(cross)),
        on_(on),
        allgather_(allgather),
        algorithm_(std::string("shm reduce-scatter, ") + cross_->name() +
                   " allreduce among equal local ranks, shm allgather"),
        allgather_algorithm_(std::string(cross_->name()) +
                             " allgatherv among equal local ranks, shm allgatherv, reorder") {
    // by_local_[l]: the set indices of the members with local index l, in the order of
    // their cross-host sub-group (world rank order).
    by_local_.resize(layout_.members[0].size());
    for (size_t l = 0; l < by_local_.size(); ++l) {
      std::vector<int> world;
      for (const auto& host : layout_.members) world.push_back(host[l]);
      std::sort(world.begin(), world.end());
      for (int w : world)
        by_local_[l].push_back(static_cast<int>(
            std::find(layout_.ranks.begin(), layout_.ranks.end(), w) - layout_.ranks.begin()));
    }
  }

  const char* name() const override { return "hierarchical"; }
  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    if (op == OpType::kAllgather)
      return allgather_ && device == DeviceType::kCpu && flat_.supports(op, dtype, device) &&
             local_->supports(op, dtype, device) && cross_->supports(op, dtype, device);
    return op == OpType::kAllreduce && device == DeviceType::kCpu &&
           flat_.supports(op, dtype, device) &&
           local_->supports(OpType::kReducescatter, dtype, device) &&
           cross_->supports(op, dtype, device);
  }
  int rank() const override { return flat_.rank(); }
  int size() const override { return flat_.size(); }
  const char* algorithm(OpType op, int64_t bytes) const override {
    if (op == OpType::kAllgather && allgather_) return allgather_algorithm_.c_str();
    return op == OpType::kAllreduce && on() ? algorithm_.c_str() : flat_.algorithm(op, bytes);
  }

  void setOn(bool on) { on_.store(on, std::memory_order_relaxed); }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  int switchState(BackendSwitch which) const override {
    return which == BackendSwitch::kHierarchicalAllreduce ? (on() ? 1 : 0) : -1;
  }
  bool setSwitch(BackendSwitch which, bool on) override {
    if (which != BackendSwitch::kHierarchicalAllreduce) return false;
    setOn(on);
    return true;
  }

  void allreduce(const void* in, void* out, int64_t n, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    const int64_t esz = dataTypeSize(dtype);
    if (n == 0 || !on_.load(std::memory_order_relaxed))
      return flat_.allreduce(in, out, n, dtype, op, deadline);
    if (!announced_) {
      announced_ = true;
      TUTTI_LOG(kInfo) << "process set " << layout_.id << ": first hierarchical allreduce ("
                       << n * esz << " bytes; " << layout_.describe() << ")";
    }
    const int members = local_->size(), me = local_->rank();
    const int64_t align = std::max<int64_t>(1, 64 / esz);
    const int64_t per = ((n + members - 1) / members + align - 1) / align * align;
    counts_.assign(members, 0);
    for (int j = 0; j < members; ++j)
      counts_[j] = std::max<int64_t>(0, std::min(per, n - j * per));
    if (static_cast<int64_t>(slice_.size()) < per * esz) slice_.resize(per * esz);
    const char* step = "reduce-scatter inside the host";
    try {
      local_->reducescatter(in, slice_.data(), counts_, dtype, op, deadline);
      step = "allreduce across hosts";
      cross_->allreduce(slice_.data(), slice_.data(), counts_[me], dtype, op, deadline);
      step = "allgather inside the host";
      local_->allgatherv(slice_.data(), out, counts_, dtype, deadline);
    } catch (const Error& e) {
      fail("allreduce", std::to_string(n), dtype, step, e);
    }
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    if (!allgather_) return flat_.allgatherv(in, out, counts, dtype, deadline);
    const int64_t esz = dataTypeSize(dtype);
    const int locals = static_cast<int>(by_local_.size()), hosts = layout_.hosts();
    if (static_cast<int>(counts.size()) != locals * hosts)
      throwError(StatusCode::kInvalidArgument,
                 "hierarchical allgatherv: " + std::to_string(counts.size()) + " counts for " +
                     std::to_string(locals * hosts) + " members (" + layout_.describe() + ")");
    cross_counts_.assign(hosts, 0);
    local_counts_.assign(locals, 0);
    for (int l = 0; l < locals; ++l)
      for (int h = 0; h < hosts; ++h) {
        const int64_t c = counts[by_local_[l][h]];
        local_counts_[l] += c;
        if (l == layout_.local) cross_counts_[h] = c;
      }
    int64_t total = 0;
    for (int64_t c : local_counts_) total += c;
    if (total == 0) return;
    if (!announced_allgather_) {
      announced_allgather_ = true;
      TUTTI_LOG(kInfo) << "process set " << layout_.id << ": first hierarchical allgather ("
                       << total * esz << " bytes; " << layout_.describe() << ")";
    }
    const int64_t mine = std::max<int64_t>(1, local_counts_[layout_.local] * esz);
    if (static_cast<int64_t>(stage_.size()) < mine) stage_.resize(mine);
    if (static_cast<int64_t>(gathered_.size()) < total * esz) gathered_.resize(total * esz);
    const char* step = "allgatherv across hosts";
    try {
      cross_->allgatherv(in, stage_.data(), cross_counts_, dtype, deadline);
      step = "allgatherv inside the host";
      local_->allgatherv(stage_.data(), gathered_.data(), local_counts_, dtype, deadline);
    } catch (const Error& e) {
      fail("allgatherv", std::to_string(total), dtype, step, e);
    }
    // gathered_ holds local index 0's blocks (hosts in world rank order), then 1's, ...
    offsets_.assign(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) offsets_[i] = offsets_[i - 1] + counts[i - 1];
    const uint8_t* from = gathered_.data();
    for (const auto& group : by_local_)
      for (int i : group) {
        if (counts[i] > 0)
          std::memcpy(static_cast<uint8_t*>(out) + offsets_[i] * esz, from, counts[i] * esz);
        from += counts[i] * esz;
      }
  }

  // Not taken (supports() says allreduce and allgather only): the transport's backend runs
  // them.
  void broadcast(void* buf, int64_t count, DataType dtype, int root, Deadline deadline) override {
    flat_.broadcast(buf, count, dtype, root, deadline);
  }
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    flat_.alltoallv(in, send_counts, out, recv_counts, dtype, deadline);
  }
  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    flat_.reducescatter(in, out, counts, dtype, op, deadline);
  }
  void barrier(Deadline deadline) override { flat_.barrier(deadline); }

  void abort(const std::string& reason) override {
    local_->abort(reason);
    cross_->abort(reason);
    local_control_->abort(reason);
  }

 private:
  // Aborts every sub-group and throws e's code, naming this rank, the op and the step.
  [[noreturn]] void fail(const char* op, const std::string& count, DataType dtype,
                         const char* step, const Error& e) {
    const std::string message = "rank " + std::to_string(layout_.localRanks()[layout_.local]) +
                                ": hierarchical " + op + " of " + count + " " +
                                dataTypeName(dtype) + " (" + layout_.describe() + "), step '" +
                                step + "': " + e.what();
    abort(message);
    throwError(e.code(), message);
  }

  const detail::HostLayout layout_;
  Backend& flat_;
  std::unique_ptr<ControlPlane> local_control_;  // made local_'s segment; kept for abort
  std::unique_ptr<Backend> local_;               // shm, this host's members
  std::unique_ptr<Backend> cross_;               // transport, one member per host
  std::atomic<bool> on_;
  const bool allgather_;  // hierarchical allgatherv (else flat_ runs it)
  const std::string algorithm_, allgather_algorithm_;
  std::vector<std::vector<int>> by_local_;
  bool announced_ = false, announced_allgather_ = false;
  std::vector<int64_t> counts_, cross_counts_, local_counts_, offsets_;
  std::vector<uint8_t> slice_, stage_, gathered_;
};

}  // namespace

std::unique_ptr<Backend> makeHierarchicalBackend(Transport& transport, ControlPlane& control,
                                                 Backend& flat,
                                                 const detail::HostLayout& layout, bool on,
                                                 const detail::ShmOptions& shm) {
  std::string why;
  if (!layout.even())
    why = layout.describe() + " (needs 2 or more hosts with the same number > 1 of members)";
  else if (!layout.shm)
    why = "TUTTI_SHM=0 on a member";
  if (!why.empty()) {
    TUTTI_LOG(kDebug) << "process set " << layout.id << ": no hierarchical allreduce: " << why;
    return nullptr;
  }
  // Sub-groups: this host's members (collective per host), then the members with this
  // local index (one per host). Every member makes them in this order.
  auto local_control = transport.makeControlPlane(layout.localRanks(), layout.localDataId());
  auto local = makeShmBackend(*local_control, layout.localRanks(), layout.localDataId(), shm);
  auto cross = transport.makeBackend(layout.crossRanks(), layout.crossId());
  // Every member must agree: shm may decline on one host (a small /dev/shm).
  std::vector<uint64_t> ok = {local ? 1u : 0u};
  control.allreduceAnd(ok, deadlineAfter(shm.setup_seconds));
  if (ok[0] == 0) {
    TUTTI_LOG(kInfo) << "process set " << layout.id
                     << ": no hierarchical allreduce: shm declined on some host";
    return nullptr;
  }
  TUTTI_LOG(kDebug) << "process set " << layout.id << ": hierarchical allreduce, "
                    << (on ? "on" : "off for now") << " (" << layout.describe() << ")";
  return std::make_unique<HierarchicalBackend>(layout, flat, std::move(local_control),
                                               std::move(local), std::move(cross), on,
                                               layout.hierarchical_allgather);
}

std::unique_ptr<Backend> makeHierarchicalBackend(Transport& transport, ControlPlane& control,
                                                 Backend& flat, const std::vector<int>& ranks,
                                                 int id, const BackendOptions& options) {
  const detail::HostLayout layout =
      detail::exchangeLayout(control, id, options.size, ranks, options.shm,
                             options.hierarchical_allreduce,
                             deadlineAfter(options.start_timeout_seconds),
                             options.hierarchical_allgather);
  detail::ShmOptions shm;
  shm.enabled = options.shm;
  shm.buffer_bytes = options.shm_buffer_bytes;
  shm.setup_seconds = options.start_timeout_seconds;
  return makeHierarchicalBackend(transport, control, flat, layout, layout.hierarchical, shm);
}

}  // namespace tutti
