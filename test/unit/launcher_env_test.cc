// The launchers' variables (core/launcher_env.h) and what rank 0 warns of at init
// (environmentWarnings, core/config.h).
#include "core/config.h"
#include "core/launcher_env.h"

#include "test/catch.h"
#include "test/unit/env_vars_doc.h"

#include <string>

using namespace tutti;
using Env = std::map<std::string, std::string>;

namespace {

// What torchrun --nproc_per_node 2 --nnodes 2 gives its worker of global rank 3.
Env torchrunWorker() {
  return {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"ROLE_RANK", "3"},
          {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job7"},
          {"TORCHELASTIC_RESTART_COUNT", "2"}, {"HOME", "/home/u"}};
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace

TEST_CASE("torchrun: rank, size, local and cross values, and rank 0's rendezvous") {
  const LauncherEnv l = parseLauncherEnv(torchrunWorker());
  const Topology& t = l.topology;
  CHECK(t.source == "torchrun");
  CHECK((t.rank == 3 && t.size == 4 && t.local_rank == 1 && t.local_size == 2 &&
         t.cross_rank == 1 && t.cross_size == 2 && t.local_given && t.cross_given));
  CHECK((l.hosted.launcher == "torchrun" && l.hosted.host == "node1" && l.hosted.port == 29501));
  CHECK(l.hosted.port_from == "MASTER_PORT 29500 + 1");
  CHECK_FALSE(l.hosted.one_host);
  CHECK(l.hosted.home == "/home/u");
  CHECK(l.hosted.missing.empty());
  // A restart (torchrun --max-restarts) is another job: its ranks never join the old server.
  Env restarted = torchrunWorker();
  restarted["TORCHELASTIC_RESTART_COUNT"] = "3";
  CHECK(parseLauncherEnv(restarted).hosted.identity != l.hosted.identity);

  Env one_host = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                  {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", "65535"}, {"TORCHELASTIC_RUN_ID", "none"}};
  const LauncherEnv o = parseLauncherEnv(one_host);
  CHECK((o.hosted.one_host && o.hosted.port == 65534 && !o.topology.cross_given));
  CHECK(torchrunRendezvousPort(29500) == 29501);
  CHECK(torchrunRendezvousPort(65535) == 65534);

  // The backends are told where to meet; gloo is their default.
  const BackendOptions b = backendOptions(parseConfig(&one_host));
  CHECK((b.launcher == "torchrun" && b.rank == 1 && b.size == 2 && b.hosted.port == 65534 &&
         b.hosted.host == "127.0.0.1"));

  Env bad = torchrunWorker();
  bad["MASTER_PORT"] = "http";
  CHECK_THROWS_WITH(parseLauncherEnv(bad), Catch::Contains("MASTER_PORT='http'"));
}

TEST_CASE("torchrun's agent wins over the mpirun or srun that started it") {
  Env env = torchrunWorker();
  env["OMPI_COMM_WORLD_RANK"] = "0";
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  env["SLURM_PROCID"] = "1";
  env["SLURM_STEP_NUM_TASKS"] = "2";
  env["SLURM_STEP_ID"] = "0";
  CHECK(parseLauncherEnv(env).topology.source == "torchrun");
  // torch.distributed's variables alone (a script that set them from Open MPI's) do not
  // override the launcher that started the process.
  env.erase("TORCHELASTIC_RUN_ID");
  CHECK(parseLauncherEnv(env).topology.source == "Open MPI");
  env.erase("OMPI_COMM_WORLD_RANK");
  CHECK(parseLauncherEnv(env).topology.source == "Slurm");
  env.erase("SLURM_STEP_ID");
  const LauncherEnv l = parseLauncherEnv(env);
  CHECK((l.topology.source == "torchrun" && l.topology.rank == 3));
}

TEST_CASE("torch.distributed's RANK and WORLD_SIZE without MASTER_ADDR are said to be unusable") {
  Env env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}};
  const LauncherEnv l = parseLauncherEnv(env);
  CHECK((l.topology.source == "single process" && l.topology.size == 1));
  REQUIRE(l.unusable.size() == 1);
  CHECK_THAT(l.unusable[0], Catch::Contains("RANK=1 and WORLD_SIZE=2") &&
                                Catch::Contains("MASTER_ADDR is not") &&
                                Catch::Contains("world of one"));
  Env single = {{"RANK", "0"}, {"WORLD_SIZE", "1"}};
  CHECK(parseLauncherEnv(single).unusable.empty());
  Env half = {{"PMI_RANK", "0"}};
  CHECK_THAT(joined(parseLauncherEnv(half).unusable),
             Catch::Contains("PMI_RANK is set but PMI_SIZE is not"));
}

TEST_CASE("hydra (MPICH, Intel MPI): rank, size, local values; rank 0's address must be given") {
  Env env = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"},
             {"MPI_LOCALNRANKS", "2"}, {"PMI_FD", "6"}};
  LauncherEnv l = parseLauncherEnv(env);
  CHECK(l.topology.source == "hydra");
  CHECK((l.topology.rank == 1 && l.topology.size == 2 && l.topology.local_given &&
         l.topology.local_rank == 1 && l.topology.local_size == 2));
  CHECK((l.hosted.one_host && l.hosted.host == "127.0.0.1" && l.hosted.port == 0));
  CHECK_THAT(l.hosted.missing, Catch::Contains("set TUTTI_RENDEZVOUS_PORT") &&
                                   !Catch::Contains("TUTTI_RENDEZVOUS_ADDR"));
  env["TUTTI_RENDEZVOUS_PORT"] = "29650";
  l = parseLauncherEnv(env);
  CHECK((l.hosted.port == 29650 && l.hosted.missing.empty()));
  // Across hosts: rank 0's host too.
  env["PMI_SIZE"] = "4";
  l = parseLauncherEnv(env);
  CHECK_FALSE(l.hosted.one_host);
  CHECK_THAT(l.hosted.missing, Catch::Contains("TUTTI_RENDEZVOUS_ADDR to rank 0's host"));
  env["TUTTI_RENDEZVOUS_ADDR"] = "node1";
  l = parseLauncherEnv(env);
  CHECK((l.hosted.host == "node1" && l.hosted.missing.empty()));
  // srun --mpi=pmi2 sets PMI_RANK too: Slurm's step comes first.
  env["SLURM_PROCID"] = "1";
  env["SLURM_STEP_NUM_TASKS"] = "4";
  env["SLURM_STEP_ID"] = "0";
  CHECK(parseLauncherEnv(env).topology.source == "Slurm");
}

TEST_CASE("HOROVOD_ variables without a twin and misspelt TUTTI_ names are warned of") {
  Env env = {{"HOROVOD_TORUS_ALLREDUCE", "1"},   {"HOROVOD_CONTROLLER", "gloo"},
             {"HOROVOD_CYCLE_TIME", "5"},        {"HOROVOD_RANK", "0"},
             {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3"}, {"HOROVOD_ELASTIC", ""},
             {"TUTTI_FUSION_THRESHHOLD", "1"},   {"TUTTI_CYCLE_TIME", "2"},
             {"tutti_shm", "0"},                 {"TUTTI_RANK", "0"},
             {"TUTTI_CONFORMANCE_MAX_MEMBERS", "3"}, {"TUTTI_SHM", "1"},
             {"TUTTI_LAUNCHER_SETTINGS", "TUTTI_SHM"}};
  const auto warnings = environmentWarnings(env);
  const std::string all = joined(warnings);
  INFO(all);
  CHECK(warnings.size() == 6);
  CHECK_THAT(all, Catch::Contains("HOROVOD_TORUS_ALLREDUCE is not read by Tutti") &&
                      Catch::Contains("HOROVOD_CONTROLLER is not read by Tutti") &&
                      Catch::Contains("HOROVOD_AUTOTUNE_WARMUP_SAMPLES is not read by Tutti "
                                      "(use TUTTI_AUTOTUNE_WARMUP_WINDOWS") &&
                      Catch::Contains("TUTTI_FUSION_THRESHHOLD is not a Tutti variable and is "
                                      "ignored: did you mean TUTTI_FUSION_THRESHOLD?") &&
                      Catch::Contains("TUTTI_CYCLE_TIME is not a Tutti variable and is ignored: "
                                      "did you mean TUTTI_CYCLE_TIME_MS?") &&
                      Catch::Contains("tutti_shm is not a Tutti variable and is ignored: did "
                                      "you mean TUTTI_SHM?"));
  CHECK(all.find("#") == std::string::npos);  // no issue numbers
  CHECK(environmentWarnings(Env{{"HOROVOD_FUSION_THRESHOLD", "1"}}).empty());
}

TEST_CASE("every runtime variable of Horovod 0.28 is a twin or warned of, and documented") {
  // horovod/common/common.h of Horovod 0.28.1, and horovodrun's gloo rendezvous.
  const char* const horovod[] = {
      "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
      "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_AUTOTUNE_LOG",
      "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
      "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_CACHE_CAPACITY", "HOROVOD_CCL_CACHE",
      "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_CYCLE_TIME",
      "HOROVOD_DISABLE_GROUP_FUSION", "HOROVOD_DISABLE_NVTX_RANGES",
      "HOROVOD_DYNAMIC_PROCESS_SETS", "HOROVOD_ELASTIC", "HOROVOD_ENABLE_ASYNC_COMPLETION",
      "HOROVOD_ENABLE_XLA_OPS", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_GLOO_IFACE",
      "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_HIERARCHICAL_ALLREDUCE",
      "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_NUM_NCCL_STREAMS", "HOROVOD_STALL_CHECK_DISABLE",
      "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
      "HOROVOD_THREAD_AFFINITY", "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES",
      "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"};
  const std::string doc = envVarsDoc();
  for (const char* name : horovod) {
    INFO(name);
    int found = 0;
    for (const auto& twin : horovodTwins()) found += std::string(twin.horovod) == name;
    for (const auto& unread : horovodWithoutTwin()) found += std::string(unread.horovod) == name;
    CHECK(found == 1);
    CHECK(doc.find(std::string("`") + name + "`") != std::string::npos);
  }
}
