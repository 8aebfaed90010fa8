// Hierarchical allreduce, per call while on (every member takes the same path: all switch
// at the same point):
//   1. reduce-scatter inside the host over shm: local member l gets slice l of the host's
//      reduction (slices split the tensor evenly, 64-byte aligned);
//   2. allreduce of slice l across hosts among the members with local index l (the
//      transport's backend over that sub-group: one rank per host, in parallel for every l);
//   3. allgather of the slices inside the host over shm, into the output.
// Each host sends (hosts - 1)/hosts of the tensor twice over the network in all, instead
// of once per member. Slices live in one persistent buffer. A failure in any step aborts
// every sub-group, so that the members still waiting fail fast.
#include "backends/hierarchical/hier_backend.h"

#include "backends/shm/shm_backend.h"
#include "core/logging.h"

#include <algorithm>
#include <atomic>

namespace tutti {
namespace {

class HierarchicalBackend : public Backend {
 public:
  HierarchicalBackend(detail::HostLayout layout, Backend& flat,
                      std::unique_ptr<ControlPlane> local_control,
                      std::unique_ptr<Backend> local, std::unique_ptr<Backend> cross, bool on)
      : layout_(std::move(layout)),
        flat_(flat),
        local_control_(std::move(local_control)),
        local_(std::move(local)),
        cross_(std::move(cross)),
        on_(on),
        algorithm_(std::string("shm reduce-scatter, ") + cross_->name() +
                   " allreduce among equal local ranks, shm allgather") {}

  const char* name() const override { return "hierarchical"; }
  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    return op == OpType::kAllreduce && device == DeviceType::kCpu &&
           flat_.supports(op, dtype, device) &&
           local_->supports(OpType::kReducescatter, dtype, device) &&
           cross_->supports(op, dtype, device);
  }
  int rank() const override { return flat_.rank(); }
  int size() const override { return flat_.size(); }
  const char* algorithm(OpType op, int64_t bytes) const override {
    return op == OpType::kAllreduce && on() ? algorithm_.c_str() : flat_.algorithm(op, bytes);
  }

  void setOn(bool on) { on_.store(on, std::memory_order_relaxed); }
  bool on() const { return on_.load(std::memory_order_relaxed); }

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
      const std::string message = "rank " + std::to_string(layout_.localRanks()[layout_.local]) +
                                  ": hierarchical allreduce of " + std::to_string(n) + " " +
                                  dataTypeName(dtype) + " (" + layout_.describe() +
                                  "), step '" + step + "': " + e.what();
      abort(message);
      throwError(e.code(), message);
    }
  }

  // Not taken (supports() says allreduce only): the transport's backend runs them.
  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    flat_.allgatherv(in, out, counts, dtype, deadline);
  }
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
  const detail::HostLayout layout_;
  Backend& flat_;
  std::unique_ptr<ControlPlane> local_control_;  // made local_'s segment; kept for abort
  std::unique_ptr<Backend> local_;               // shm, this host's members
  std::unique_ptr<Backend> cross_;               // transport, one member per host
  std::atomic<bool> on_;
  const std::string algorithm_;
  bool announced_ = false;
  std::vector<int64_t> counts_;
  std::vector<uint8_t> slice_;
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
                                               std::move(local), std::move(cross), on);
}

std::unique_ptr<Backend> makeHierarchicalBackend(Transport& transport, ControlPlane& control,
                                                 Backend& flat, const std::vector<int>& ranks,
                                                 int id, const Config& config) {
  const detail::HostLayout layout =
      detail::exchangeLayout(control, id, config.topology.size, ranks, config.shm,
                             config.hierarchical_allreduce,
                             deadlineAfter(config.start_timeout_seconds));
  detail::ShmOptions shm;
  shm.enabled = config.shm;
  shm.buffer_bytes = config.shm_buffer_bytes;
  shm.setup_seconds = config.start_timeout_seconds;
  return makeHierarchicalBackend(transport, control, flat, layout, layout.hierarchical, shm);
}

int hierarchicalState(const Backend& backend) {
  auto* hierarchical = dynamic_cast<const HierarchicalBackend*>(&backend);
  return hierarchical ? (hierarchical->on() ? 1 : 0) : -1;
}

bool setHierarchical(Backend& backend, bool on) {
  auto* hierarchical = dynamic_cast<HierarchicalBackend*>(&backend);
  if (hierarchical) hierarchical->setOn(on);
  return hierarchical != nullptr;
}

}  // namespace tutti
