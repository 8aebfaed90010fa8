// gloo under plain `srun`, torchrun or hydra (no tuttirun): rank 0 hosts the job's rendezvous server
// (RendezvousServer) on a thread of its own and every rank finds it from what Slurm gives
// every task:
//  - host: TUTTI_RENDEZVOUS_ADDR, else the first node of SLURM_STEP_NODELIST, where Slurm's
//    block, cyclic and plane distributions all put task 0 (rank 0 checks SLURM_NODEID == 0);
//  - port: TUTTI_RENDEZVOUS_PORT, else slurmRendezvousPort(SLURM_JOB_ID, SLURM_STEP_ID);
//  - secret: TUTTI_SECRET (or TUTTI_SECRET_FILE), else ~/.tutti/secret, which must be a
//    regular file of the user's that no one else can read; with none the job fails: an
//    unauthenticated server would let anyone who reaches the port into the job.
// Rank 0 stores the step's identity ("<job>.<step>") under a key of this transport's
// generation before anyone can ask; every rank reads it back, so a server of another job
// that happens to hold the port is named as such instead of being joined.
// torchrun and hydra: the host, port and identity come from their variables
// (HostedRendezvous, core/launcher_env.h), the secret as under srun; where every rank runs on
// rank 0's host and no secret exists, rank 0 makes ~/.tutti/secret (mode 0600) and the
// others wait for it.
#pragma once

#include "backends/gloo/rendezvous_client.h"
#include "backends/gloo/rendezvous_server.h"
#include "backends/options.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

// Slurm's hostlist syntax: "a,b", "n[1-3,07-09]", "r[1-2]n[1-2]" (the rightmost range
// varies fastest), in order. Throws Error(kInvalidArgument) naming `what` on a malformed
// list or one of more than `max_hosts` names.
std::vector<std::string> expandHostlist(const std::string& list, const std::string& what,
                                        size_t max_hosts = 1 << 20);

// 20000 + (job mod 750) * 16 + step mod 16, below Linux's ephemeral ports (32768 and up):
// the first 16 steps of 750 consecutive jobs all get ports of their own. Throws when an id
// is not a number.
int slurmRendezvousPort(const std::string& job_id, const std::string& step_id);

// The raw secret (see above), or Error(kInvalidArgument) saying how to make one.
std::string slurmSecret(const BackendOptions& options);

// The raw secret: `hex` (TUTTI_SECRET), else `home`/.tutti/secret. Where neither exists and
// `make` is set, rank 0 (`first`) creates that file (mode 0600, in a directory of mode
// 0700) and the others wait for it until `deadline`. `who` begins every message; `before`
// says where to export TUTTI_SECRET ("srun or sbatch").
std::string jobSecret(const std::string& hex, const std::string& home, const std::string& who,
                      const std::string& before, bool make, bool first,
                      std::chrono::steady_clock::time_point deadline);

struct ServedRendezvous {
  std::unique_ptr<RendezvousServer> server;  // rank 0 only; outlives `client`
  std::unique_ptr<RendezvousClient> client;
  std::string host;
  int port = 0;
};

// Starts the server on rank 0 and connects this rank's client, verified against the step's
// identity, within TUTTI_START_TIMEOUT_SECONDS. `generation` numbers this process's gloo
// transports (the same on every rank).
ServedRendezvous connectSlurmRendezvous(const BackendOptions& options, int generation);

// The same for torchrun and hydra, from options.hosted (TUTTI_RENDEZVOUS_ADDR and _PORT
// override its host and port).
ServedRendezvous connectHostedRendezvous(const BackendOptions& options, int generation);

}  // namespace detail
}  // namespace tutti
