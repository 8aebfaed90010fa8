#include "core/launcher_env.h"

#include "base/common.h"

namespace tutti {
namespace {

using Env = std::map<std::string, std::string>;

struct Source {
  const char* label;
  const char *rank, *size, *local_rank, *local_size, *cross_rank, *cross_size;
};

// Local and cross rank and size are measured at init (core/topology.h); what a launcher
// says of them is kept to be checked. Slurm's SLURM_LOCALID/SLURM_NODEID are not Horovod's
// local/cross values on every layout (SLURM_NTASKS_PER_NODE is set only with
// --ntasks-per-node; node ids count nodes, not ranks with the same local rank), so Slurm
// gives rank and size only. torchrun's GROUP_RANK is the node's index and counts as the
// cross rank only where every node runs LOCAL_WORLD_SIZE ranks (checked at init).
const Source kTuttirun = {"tuttirun", "TUTTI_RANK", "TUTTI_SIZE", "TUTTI_LOCAL_RANK",
                          "TUTTI_LOCAL_SIZE", "TUTTI_CROSS_RANK", "TUTTI_CROSS_SIZE"};
const Source kTorchrun = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "GROUP_RANK", "GROUP_WORLD_SIZE"};
const Source kOpenMpi = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                         "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr,
                         nullptr};
const Source kSlurm = {"Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", nullptr, nullptr,
                       nullptr, nullptr};
const Source kHydra = {"hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                       nullptr, nullptr};

class Reader {
 public:
  explicit Reader(const Env& env) : env_(env) {}
  bool has(const char* key) const {
    if (key == nullptr) return false;
    auto it = env_.find(key);
    return it != env_.end() && !it->second.empty();
  }
  std::string get(const char* key) const {
    auto it = env_.find(key);
    return it == env_.end() ? std::string() : it->second;
  }
  int number(const char* key, int lo, int hi) const {
    return static_cast<int>(parseIntVariable(key, get(key), lo, hi));
  }
  bool present(const Source& s) const { return has(s.rank) && has(s.size); }

  Topology topology(const Source& s) const {
    Topology t;
    t.source = s.label;
    t.size = number(s.size, 1, 1 << 24);
    t.rank = number(s.rank, 0, t.size - 1);
    // Until measured: every rank on a host of its own.
    t.cross_rank = t.rank;
    t.cross_size = t.size;
    if (has(s.local_rank) && has(s.local_size)) {
      t.local_given = true;
      t.local_size = number(s.local_size, 1, t.size);
      t.local_rank = number(s.local_rank, 0, t.local_size - 1);
    }
    if (has(s.cross_rank) && has(s.cross_size)) {
      t.cross_given = true;
      t.cross_size = number(s.cross_size, 1, t.size);
      t.cross_rank = number(s.cross_rank, 0, t.cross_size - 1);
    }
    return t;
  }

 private:
  const Env& env_;
};

SlurmStep slurmStep(const Reader& r) {
  SlurmStep step;
  step.job_id = r.get("SLURM_JOB_ID");
  step.step_id = r.get("SLURM_STEP_ID");
  step.node_list = r.get("SLURM_STEP_NODELIST");
  if (step.node_list.empty()) step.node_list = r.get("SLURM_JOB_NODELIST");
  if (r.has("SLURM_NODEID")) step.node_id = r.number("SLURM_NODEID", 0, 1 << 24);
  step.node_name = r.get("SLURMD_NODENAME");
  step.pmi = r.has("PMIX_RANK") || r.has("PMI_RANK") || r.has("PMI_FD");
  step.home = r.get("HOME");
  return step;
}

ElasticWorker elasticWorker(const Reader& r) {
  ElasticWorker w;
  w.id = r.get("TUTTI_ELASTIC_WORKER");
  if (r.has("TUTTI_ELASTIC_GENERATION"))
    w.first_generation = parseIntVariable("TUTTI_ELASTIC_GENERATION",
                                          r.get("TUTTI_ELASTIC_GENERATION"), 0, int64_t(1) << 40);
  if (r.has("TUTTI_ELASTIC_TIMEOUT"))
    w.timeout_seconds =
        parseDoubleVariable("TUTTI_ELASTIC_TIMEOUT", r.get("TUTTI_ELASTIC_TIMEOUT"), 0.001, 1e7);
  return w;
}

// torchrun: rank 0 serves on MASTER_ADDR, next to the TCPStore torch keeps on MASTER_PORT.
// The identity names the run and its restart, so that a server left by an earlier attempt
// (torchrun --max-restarts) or another run is not joined.
HostedRendezvous torchrunRendezvous(const Reader& r, const Topology& t) {
  HostedRendezvous h;
  h.launcher = "torchrun";
  h.host = r.get("MASTER_ADDR");
  h.host_from = "MASTER_ADDR";
  const int master_port = r.number("MASTER_PORT", 1, 65535);
  h.port = torchrunRendezvousPort(master_port);
  h.port_from =
      "MASTER_PORT " + std::to_string(master_port) + (h.port > master_port ? " + 1" : " - 1");
  const std::string run = r.has("TORCHELASTIC_RUN_ID") ? r.get("TORCHELASTIC_RUN_ID") : "-";
  const std::string restart =
      r.has("TORCHELASTIC_RESTART_COUNT") ? r.get("TORCHELASTIC_RESTART_COUNT") : "0";
  h.identity = "torchrun " + run + " restart " + restart + " at " + h.host + ":" +
               std::to_string(master_port) + " of " + std::to_string(t.size);
  h.one_host = t.local_given && t.local_size == t.size;
  h.home = r.get("HOME");
  return h;
}

// hydra gives every rank its rank, size and local values but nothing that names rank 0's
// host and a port all ranks know (its PMI_PORT and PMI_FD are each node's proxy): on one
// host rank 0 serves on 127.0.0.1, across hosts TUTTI_RENDEZVOUS_ADDR must name its host,
// and TUTTI_RENDEZVOUS_PORT the port either way.
HostedRendezvous hydraRendezvous(const Reader& r, const Topology& t) {
  HostedRendezvous h;
  h.launcher = "hydra";
  h.one_host = t.local_given && t.local_size == t.size;
  h.home = r.get("HOME");
  if (r.has("TUTTI_RENDEZVOUS_ADDR")) {
    h.host = r.get("TUTTI_RENDEZVOUS_ADDR");
    h.host_from = "TUTTI_RENDEZVOUS_ADDR";
  } else if (h.one_host) {
    h.host = "127.0.0.1";
    h.host_from = "every rank on one host (MPI_LOCALNRANKS = PMI_SIZE)";
  }
  if (r.has("TUTTI_RENDEZVOUS_PORT")) {
    h.port = r.number("TUTTI_RENDEZVOUS_PORT", 1, 65535);
    h.port_from = "TUTTI_RENDEZVOUS_PORT";
  }
  const std::string job = "hydra (PMI_RANK " + std::to_string(t.rank) + " of PMI_SIZE " +
                          std::to_string(t.size) + ")";
  if (h.port == 0 || h.host.empty())
    h.missing = "gloo under " + job + ": hydra tells no rank where rank 0 could serve the " +
                "job's rendezvous, so set " +
                (h.host.empty() ? "TUTTI_RENDEZVOUS_ADDR to rank 0's host and " : "") +
                "TUTTI_RENDEZVOUS_PORT to a free port on rank 0's host, for every rank "
                "(mpiexec.hydra -genv TUTTI_RENDEZVOUS_PORT 29650" +
                (h.host.empty() ? " -genv TUTTI_RENDEZVOUS_ADDR node1" : "") + " ...)";
  h.identity = "hydra job of " + std::to_string(t.size) + " at " + h.host + ":" +
               std::to_string(h.port);
  return h;
}

}  // namespace

int torchrunRendezvousPort(int master_port) {
  return master_port < 65535 ? master_port + 1 : master_port - 1;
}

LauncherEnv parseLauncherEnv(const Env& env) {
  const Reader r(env);
  LauncherEnv out;
  if (r.has("TUTTI_ELASTIC_WORKER")) {  // rank and size come from the rendezvous
    out.topology.source = "tuttirun elastic";
    out.elastic = elasticWorker(r);
    return out;
  }
  const bool torch_env = r.present(kTorchrun);
  const bool torch_master = r.has("MASTER_ADDR") && r.has("MASTER_PORT");
  auto torchrun = [&] {
    out.topology = r.topology(kTorchrun);
    out.hosted = torchrunRendezvous(r, out.topology);
    return out;
  };
  if (r.present(kTuttirun)) {
    out.topology = r.topology(kTuttirun);
    return out;
  }
  // torchrun's agent sets TORCHELASTIC_RUN_ID: its workers may also see the variables of
  // the mpirun or srun that started the agent, which describe the agent, not them.
  if (torch_env && torch_master && r.has("TORCHELASTIC_RUN_ID")) return torchrun();
  if (r.present(kOpenMpi)) {
    out.topology = r.topology(kOpenMpi);
    return out;
  }
  // A program run straight from an sbatch script sees SLURM_PROCID=0 and the job's
  // SLURM_NTASKS too, yet it is one process: only a task of a job step (SLURM_STEP_ID set:
  // started by srun) counts.
  if (r.present(kSlurm) && r.has("SLURM_STEP_ID")) {
    out.topology = r.topology(kSlurm);
    out.slurm = slurmStep(r);
    return out;
  }
  if (r.present(kHydra)) {
    out.topology = r.topology(kHydra);
    out.hosted = hydraRendezvous(r, out.topology);
    return out;
  }
  if (torch_env && torch_master) return torchrun();
  if (torch_env && r.get("WORLD_SIZE") != "1")
    out.unusable.push_back(
        "RANK=" + r.get("RANK") + " and WORLD_SIZE=" + r.get("WORLD_SIZE") +
        " are set (torch.distributed's) but " +
        (r.has("MASTER_ADDR")   ? "MASTER_PORT is"
         : r.has("MASTER_PORT") ? "MASTER_ADDR is"
                                : "MASTER_ADDR and MASTER_PORT are") +
        " not, so rank 0's address is unknown: this process runs as a world of one (set "
        "both, or start the job with torchrun, tuttirun, mpirun or srun)");
  if (r.has("PMI_RANK") != r.has("PMI_SIZE") && !r.has("SLURM_STEP_ID"))
    out.unusable.push_back(std::string(r.has("PMI_RANK") ? "PMI_RANK" : "PMI_SIZE") +
                           " is set but " + (r.has("PMI_RANK") ? "PMI_SIZE" : "PMI_RANK") +
                           " is not: a hydra (MPICH, Intel MPI) job gives both; this process "
                           "runs as a world of one");
  return out;
}

}  // namespace tutti
