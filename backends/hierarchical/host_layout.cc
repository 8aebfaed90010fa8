#include "backends/hierarchical/host_layout.h"

#include "backends/backend.h"
#include "base/host_identity.h"

#include <algorithm>
#include <climits>
#include <sstream>

namespace tutti {
namespace detail {

bool HostLayout::spansSharedHosts() const {
  if (hosts() < 2) return false;
  for (const auto& m : members)
    if (m.size() > 1) return true;
  return false;
}

bool HostLayout::even() const {
  if (hosts() < 2 || members[0].size() < 2) return false;
  for (const auto& m : members)
    if (m.size() != members[0].size()) return false;
  return true;
}

std::vector<int> HostLayout::crossRanks() const {
  std::vector<int> out;
  for (const auto& m : members)
    if (local < static_cast<int>(m.size())) out.push_back(m[local]);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> HostLayout::leaderRanks() const {
  std::vector<int> out;
  for (const auto& m : members) out.push_back(m[0]);
  std::sort(out.begin(), out.end());
  return out;
}

std::string HostLayout::describe() const {
  std::ostringstream out;
  out << hosts() << " host" << (hosts() == 1 ? "" : "s") << " with ";
  for (int h = 0; h < hosts(); ++h) out << (h ? "+" : "") << members[h].size();
  out << " members";
  return out.str();
}

int HostLayout::subId(int k) const {
  const int64_t kinds = 3 * static_cast<int64_t>(world_size) + 1;
  const int64_t sub = -(1 + static_cast<int64_t>(id) * kinds + k);
  if (id < 0 || sub < INT_MIN)
    throwError(StatusCode::kInvalidArgument,
               "process set " + std::to_string(id) + ": too large an id for the sub-groups of "
               "hierarchical collectives in a job of " + std::to_string(world_size) + " ranks");
  return static_cast<int>(sub);
}

std::string encodeLayoutInfo(bool shm, bool hierarchical, bool hierarchical_allgather,
                             const std::string& host_identity) {
  return std::string(shm ? "1 " : "0 ") + (hierarchical ? "1 " : "0 ") +
         (hierarchical_allgather ? "1 " : "0 ") + host_identity;
}

HostLayout layoutFromInfos(int id, int world_size, const std::vector<int>& ranks, int me,
                           const std::vector<std::string>& infos) {
  if (infos.size() != ranks.size() || me < 0 || me >= static_cast<int>(ranks.size()))
    throwError(StatusCode::kInternal, "process set " + std::to_string(id) + ": " +
                                          std::to_string(infos.size()) + " host records for " +
                                          std::to_string(ranks.size()) + " members");
  HostLayout layout;
  layout.id = id;
  layout.world_size = world_size;
  layout.ranks = ranks;
  std::vector<std::string> names;
  for (size_t i = 0; i < infos.size(); ++i) {
    std::istringstream in(infos[i]);
    int shm = 0, hierarchical = 1, allgather = 0;
    in >> shm >> hierarchical >> allgather;
    in.get();
    std::string host;
    std::getline(in, host);
    layout.shm = layout.shm && shm == 1;
    if (i == 0) {
      layout.hierarchical = hierarchical == 1;
      layout.hierarchical_allgather = allgather == 1;
    }
    auto it = std::find(names.begin(), names.end(), host);
    const int h = static_cast<int>(it - names.begin());
    if (it == names.end()) {
      names.push_back(host);
      layout.members.emplace_back();
    }
    if (static_cast<int>(i) == me) {
      layout.host = h;
      layout.local = static_cast<int>(layout.members[h].size());
    }
    layout.members[h].push_back(ranks[i]);
  }
  return layout;
}

HostLayout exchangeLayout(ControlPlane& control, int id, int world_size,
                          const std::vector<int>& ranks, bool shm, bool hierarchical,
                          Deadline deadline, bool hierarchical_allgather) {
  const std::string mine =
      encodeLayoutInfo(shm, hierarchical, hierarchical_allgather, hostIdentity());
  return layoutFromInfos(id, world_size, ranks, control.rank(),
                         exchangeLines(control, mine, deadline));
}

}  // namespace detail
}  // namespace tutti
