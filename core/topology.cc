#include "core/topology.h"

#include "base/common.h"
#include "base/host_identity.h"

#include <map>
#include <sstream>

namespace tutti {
namespace {

std::string hostName(const std::string& identity) {
  return identity.substr(0, identity.find(' '));
}

std::string pair(int rank, int size) {
  return std::to_string(rank) + " of " + std::to_string(size);
}

}  // namespace

Topology topologyFromHosts(const Topology& claimed, const std::vector<std::string>& hosts) {
  if (static_cast<int>(hosts.size()) != claimed.size || claimed.rank < 0 ||
      claimed.rank >= claimed.size)
    throwError(StatusCode::kInternal, "topology: " + std::to_string(hosts.size()) +
                                          " host identities for a job of " +
                                          std::to_string(claimed.size));
  std::map<std::string, int> per_host;
  std::vector<int> local_rank(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) local_rank[r] = per_host[hosts[r]]++;
  std::map<int, int> per_local;
  std::vector<int> cross_rank(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) cross_rank[r] = per_local[local_rank[r]]++;

  Topology t = claimed;
  const int me = claimed.rank;
  t.local_rank = local_rank[me];
  t.local_size = per_host[hosts[me]];
  t.cross_rank = cross_rank[me];
  t.cross_size = per_local[t.local_rank];

  auto disagree = [&](const char* what, int said_rank, int said_size, int rank, int size) {
    std::ostringstream m;
    m << "rank " << me << ": " << claimed.source << " says " << what << " rank "
      << pair(said_rank, said_size) << ", but the job's hosts give " << what << " rank "
      << pair(rank, size) << " (this rank runs on '" << hostName(hosts[me]) << "' with "
      << per_host[hosts[me]] << " of the job's " << hosts.size() << " ranks on "
      << per_host.size() << " host" << (per_host.size() == 1 ? "" : "s")
      << "); check the launcher's host list or slots";
    throwError(StatusCode::kInvalidArgument, m.str());
  };
  if (claimed.local_given &&
      (claimed.local_rank != t.local_rank || claimed.local_size != t.local_size))
    disagree("local", claimed.local_rank, claimed.local_size, t.local_rank, t.local_size);
  if (claimed.cross_given &&
      (claimed.cross_rank != t.cross_rank || claimed.cross_size != t.cross_size))
    disagree("cross", claimed.cross_rank, claimed.cross_size, t.cross_rank, t.cross_size);
  return t;
}

Topology measureTopology(const Topology& claimed, ControlPlane& global, Deadline deadline) {
  return topologyFromHosts(claimed, exchangeLines(global, hostIdentity(), deadline));
}

}  // namespace tutti
