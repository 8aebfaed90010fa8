// What the backends are told about the job and its settings: the part of the core's Config
// (core/config.h) that the transports, the shm, hierarchical and NCCL backends, the registry
// and elastic jobs read, and nothing else. The core builds it in one place
// (backendOptions(const Config&)); tests build it directly. The defaults are Config's
// (a unit test keeps the two in step).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace tutti {

// An elastic job's worker (tuttirun --min-np/--max-np/--host-discovery-script; docs/elastic.md):
// its rank and size are not in the environment but asked of the launcher's rendezvous server
// at each init, for the newest generation (world) the launcher published.
struct ElasticWorker {
  std::string id;                // TUTTI_ELASTIC_WORKER; empty: not an elastic job
  int64_t first_generation = 0;  // TUTTI_ELASTIC_GENERATION: the one it was started for
  double timeout_seconds = 600;  // TUTTI_ELASTIC_TIMEOUT: longest wait for a new generation
};

// What Slurm gives every task of a job step started by srun (all empty/-1 otherwise). The gloo
// transport finds rank 0's in-process rendezvous server from it; the MPI transport checks that
// Open MPI has a PMI to reach.
struct SlurmStep {
  std::string job_id, step_id;  // SLURM_JOB_ID, SLURM_STEP_ID
  std::string node_list;        // SLURM_STEP_NODELIST (hostlist syntax: "n[1-3,5]")
  int node_id = -1;             // SLURM_NODEID: this task's node, an index into node_list
  std::string node_name;        // SLURMD_NODENAME
  bool pmi = false;             // PMIX_RANK or PMI_RANK/PMI_FD: srun --mpi=pmix (or pmi2)
  std::string home;             // HOME: where ~/.tutti/secret is looked for
};

// torchrun and hydra (MPICH, Intel MPI) have no rendezvous Tutti can use: under gloo rank 0
// serves one, as under srun, where their variables say (core/launcher_env.h).
struct HostedRendezvous {
  std::string launcher;        // "torchrun", "hydra": for messages
  std::string host, host_from; // where the other ranks reach rank 0, and what said so
  int port = 0;                // 0: none known (`missing` says what to set)
  std::string port_from;
  std::string identity;        // the job's, checked by every rank against rank 0's
  bool one_host = false;       // every rank on rank 0's host: a missing secret may be made
  std::string home;            // HOME: where ~/.tutti/secret is looked for
  std::string missing;         // why no rendezvous can be had, said when gloo connects
};

// A key-value rendezvous the program supplies (tutti_init_with_store: torch's Store, say):
// the gloo transport connects through it instead of a launcher's rendezvous server.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Throws Error(kTimeout) naming the key when it is not there within `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual std::string describe() const = 0;  // "the caller's store (TCPStore ...)"
};

struct BackendOptions {
  // This process in the job: world rank and size as the launcher gave them, local rank (the
  // NCCL device is local rank % devices; measured at init before any backend is made), and
  // the launcher ("tuttirun", "Open MPI", "Slurm", "single process", ...).
  int rank = 0, size = 1, local_rank = 0;
  std::string launcher = "single process";
  std::string cpu_operations;            // TUTTI_CPU_OPERATIONS; empty: the launcher's
  double timeout_seconds = 1800.0;       // TUTTI_TIMEOUT_SECONDS (NCCL's set-up)
  double start_timeout_seconds = 30.0;   // TUTTI_START_TIMEOUT_SECONDS: connecting
  // The gloo transport's rendezvous (tuttirun's server, or rank 0's under srun).
  std::string rendezvous_addr;           // TUTTI_RENDEZVOUS_ADDR
  int rendezvous_port = 0;               // TUTTI_RENDEZVOUS_PORT
  std::string secret;                    // TUTTI_SECRET (hex), or read from TUTTI_SECRET_FILE
  std::string gloo_iface;                // TUTTI_GLOO_IFACE
  SlurmStep slurm;                       // set when launcher == "Slurm"
  HostedRendezvous hosted;               // set when launcher is "torchrun" or "hydra"
  ElasticWorker elastic;                 // set when launcher == "tuttirun elastic"
  std::shared_ptr<KeyValueStore> store;  // tutti_init_with_store's (launcher "caller's store")
  // Shared memory and hierarchical collectives (the registry's composition).
  bool shm = true;                       // TUTTI_SHM
  int64_t shm_buffer_bytes = 0;  // TUTTI_SHM_BUFFER_BYTES: per member and buffer; 0: auto
  bool hierarchical_allreduce = true;    // TUTTI_HIERARCHICAL_ALLREDUCE
  bool hierarchical_allgather = true;    // TUTTI_HIERARCHICAL_ALLGATHER
};

}  // namespace tutti
