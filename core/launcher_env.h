// What the launchers give each process: rank and size (and local and cross values where
// the launcher has them), read from the first launcher whose variables are present, and,
// for launchers without a rendezvous Tutti can use (srun, torchrun, MPICH's and Intel MPI's
// hydra), where rank 0 serves the job's own. docs/env_vars.md, "Topology", lists them.
#pragma once

#include "core/config.h"

#include <map>
#include <string>
#include <vector>

namespace tutti {

struct LauncherEnv {
  Topology topology;
  SlurmStep slurm;            // set when topology.source == "Slurm"
  HostedRendezvous hosted;    // set when topology.source is "torchrun" or "hydra"
  ElasticWorker elastic;      // set when topology.source == "tuttirun elastic"
  // Launchers whose variables are present but that cannot be used, each with why
  // ("RANK and WORLD_SIZE are set (torch.distributed's) but MASTER_ADDR is not ...").
  std::vector<std::string> unusable;
};

// Reads `env`. Order: tuttirun (an elastic worker first), torchrun when its agent started
// the process (TORCHELASTIC_RUN_ID set), Open MPI, Slurm (a job step), hydra (PMI_RANK,
// PMI_SIZE), then torch.distributed's variables alone (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). Throws Error(kInvalidArgument) naming the variable on a bad value.
LauncherEnv parseLauncherEnv(const std::map<std::string, std::string>& env);

// MASTER_PORT + 1 (MASTER_PORT - 1 for 65535): next to torch's TCPStore on MASTER_PORT,
// never on it. TUTTI_RENDEZVOUS_PORT overrides it.
int torchrunRendezvousPort(int master_port);

}  // namespace tutti
