// The two-level AND:
//   1. AND among this host's members (shm: one round);
//   2. the first member of each host ANDs the hosts' results over the transport;
//   3. it broadcasts the result to its host's members (shm: one round).
// A host with one member skips 1 and 3. A failure in any step aborts every part, so that
// the members waiting in another part fail fast.
#include "backends/hierarchical/two_level_control_plane.h"

#include "base/logging.h"

#include <cstring>
#include <string>

namespace tutti {
namespace {

class TwoLevelControlPlane : public ControlPlane {
 public:
  TwoLevelControlPlane(std::unique_ptr<ControlPlane> set, std::unique_ptr<ControlPlane> local,
                       std::unique_ptr<ControlPlane> leaders, std::string where)
      : set_(std::move(set)),
        local_(std::move(local)),
        leaders_(std::move(leaders)),
        where_(std::move(where)) {}
  int rank() const override { return set_->rank(); }
  int size() const override { return set_->size(); }
  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    return set_->gather(bytes, deadline);
  }
  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    return set_->broadcast(bytes, deadline);
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    const char* step = "AND inside the host";
    try {
      if (local_) local_->allreduceAnd(bits, deadline);
      step = "AND across hosts";
      if (leaders_) leaders_->allreduceAnd(bits, deadline);
      step = "broadcast inside the host";
      if (!local_) return;
      const size_t bytes = bits.size() * sizeof(uint64_t);
      std::string mine;
      if (leaders_) mine.assign(reinterpret_cast<const char*>(bits.data()), bytes);
      const std::string result = local_->broadcast(mine, deadline);
      if (result.size() != bytes)
        throwError(StatusCode::kInternal,
                   "two-level AND: the host's first member sent " +
                       std::to_string(result.size()) + " bytes, expected " +
                       std::to_string(bytes));
      if (bytes > 0) std::memcpy(bits.data(), result.data(), bytes);
    } catch (const Error& e) {
      const std::string message = where_ + ", step '" + step + "': " + e.what();
      abort(message);
      throwError(e.code(), message);
    }
  }

  void abort(const std::string& reason) override {
    set_->abort(reason);
    if (local_) local_->abort(reason);
    if (leaders_) leaders_->abort(reason);
  }

 private:
  std::unique_ptr<ControlPlane> set_;
  std::unique_ptr<ControlPlane> local_;    // this host's members; none when alone
  std::unique_ptr<ControlPlane> leaders_;  // first member of each host; only on those
  const std::string where_;                // "rank 3: two-level AND of process set 0 (...)"
};

}  // namespace

std::unique_ptr<ControlPlane> makeTwoLevelControlPlane(Transport& local_transport,
                                                       Transport& cross_transport,
                                                       std::unique_ptr<ControlPlane> set,
                                                       const detail::HostLayout& layout) {
  if (!layout.spansSharedHosts() || !layout.shm) return set;
  // Every member makes its parts in this order: its host's group, then (first members
  // only) the group of the first members.
  std::unique_ptr<ControlPlane> local, leaders;
  if (layout.localRanks().size() > 1)
    local = local_transport.makeControlPlane(layout.localRanks(), layout.localControlId());
  if (layout.local == 0)
    leaders = cross_transport.makeControlPlane(layout.leaderRanks(), layout.leadersId());
  if (set->rank() == 0)
    TUTTI_LOG(kInfo) << "process set " << layout.id << ": negotiation ANDs in two levels ("
                     << layout.describe() << ")";
  const std::string where = "rank " + std::to_string(layout.localRanks()[layout.local]) +
                            ": two-level AND of process set " + std::to_string(layout.id) +
                            " (" + layout.describe() + ")";
  return std::make_unique<TwoLevelControlPlane>(std::move(set), std::move(local),
                                                std::move(leaders), where);
}

}  // namespace tutti
