// Where the members of a process set run, as the hierarchical collectives see it: the
// hosts in order of their first member, the members on each, and the sub-groups a
// hierarchical set is built from (docs/architecture.md, "Hierarchical collectives").
// Internal to backends/.
#pragma once

#include "backends/backend.h"

#include <string>
#include <vector>

namespace tutti {
namespace detail {

struct HostLayout {
  int id = 0;                             // the process set
  int world_size = 1;                     // of the job: sub-group ids are made from it
  std::vector<int> ranks;                 // the set's world ranks
  std::vector<std::vector<int>> members;  // world ranks on each host, in rank order
  int host = 0;                           // this member's host (index into members)
  int local = 0;                          // this member's index among its host's members
  bool shm = true;                        // every member enables shm (TUTTI_SHM)
  bool hierarchical = true;               // member 0's TUTTI_HIERARCHICAL_ALLREDUCE
  bool hierarchical_allgather = false;    // member 0's TUTTI_HIERARCHICAL_ALLGATHER

  int hosts() const { return static_cast<int>(members.size()); }
  // More than one host, and some host with more than one member: worth two levels.
  bool spansSharedHosts() const;
  // Spans hosts with the same number (> 1) of members on each: hierarchical allreduce.
  bool even() const;
  const std::vector<int>& localRanks() const { return members[host]; }
  // World ranks with this member's local index, one per host (sorted); even() layouts.
  std::vector<int> crossRanks() const;
  // The first member of every host (sorted).
  std::vector<int> leaderRanks() const;
  std::string describe() const;  // "2 hosts x 2 members"

  // Ids of the sub-groups (negative: never a process set's; unique in the job).
  int localControlId() const { return subId(host); }
  int localDataId() const { return subId(world_size + host); }
  int crossId() const { return subId(2 * world_size + local); }
  int leadersId() const { return subId(3 * world_size); }

 private:
  int subId(int k) const;
};

// Pure: the layout of set member `me` when member i (world rank ranks[i]) says infos[i],
// each "<shm 0|1> <hierarchical allreduce 0|1> <hierarchical allgather 0|1> <host identity>".
HostLayout layoutFromInfos(int id, int world_size, const std::vector<int>& ranks, int me,
                           const std::vector<std::string>& infos);
std::string encodeLayoutInfo(bool shm, bool hierarchical, bool hierarchical_allgather,
                             const std::string& host_identity);

// Collective over `control` (the set's members): every member's host, TUTTI_SHM,
// TUTTI_HIERARCHICAL_ALLREDUCE and TUTTI_HIERARCHICAL_ALLGATHER, one gather and one broadcast.
HostLayout exchangeLayout(ControlPlane& control, int id, int world_size,
                          const std::vector<int>& ranks, bool shm, bool hierarchical,
                          Deadline deadline, bool hierarchical_allgather = false);

}  // namespace detail
}  // namespace tutti
