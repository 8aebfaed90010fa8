// The job's topology, measured: every rank's host identity is exchanged over the global
// control plane at init, and local and cross rank and size follow from it, under any
// launcher and any layout (uneven slots, a host named once per slot, interleaved ranks).
// What the launcher's variables said (Topology::local_given / cross_given) is checked
// against the measurement; a disagreement is an error naming both.
//
// Definitions (Horovod's): local rank = index among the ranks on the same host, in rank
// order; local size = ranks on that host; cross rank = index among the ranks with the same
// local rank, in rank order; cross size = how many ranks have that local rank.
#pragma once

#include "backends/backend.h"
#include "core/config.h"

#include <string>
#include <vector>

namespace tutti {

// Pure: the topology of `rank` when rank r runs on hosts[r]. `claimed` gives rank, size,
// source and what the launcher said; throws Error(kInvalidArgument) when a value the
// launcher gave disagrees with the hosts.
Topology topologyFromHosts(const Topology& claimed, const std::vector<std::string>& hosts);

// Collective over the global control plane (every rank, at init): exchanges identities and
// returns topologyFromHosts() for this rank.
Topology measureTopology(const Topology& claimed, ControlPlane& global, Deadline deadline);

}  // namespace tutti
