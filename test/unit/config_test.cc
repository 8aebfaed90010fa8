#include "base/common.h"
#include "core/config.h"

#include "test/catch.h"
#include "test/unit/env_vars_doc.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace tutti;
using Env = std::map<std::string, std::string>;

TEST_CASE("config defaults with an empty environment") {
  Env env;
  Config c = parseConfig(&env);
  CHECK(c.fusion_threshold == 128ll * 1024 * 1024);
  CHECK(c.cycle_time_ms == 1.0);
  CHECK(c.cpu_operations.empty());
  CHECK(c.cache_capacity == 1024);
  CHECK(c.log_level == LogLevel::kWarning);
  CHECK(c.timeout_seconds == 1800);       // collectives: 30 minutes, like torch.distributed
  CHECK(c.start_timeout_seconds == 30);   // connecting: like horovodrun --start-timeout
  CHECK(c.topology.size == 1);
  CHECK(c.topology.rank == 0);
  CHECK(c.topology.source == "single process");
  CHECK(c.shm_buffer_bytes == 0);  // auto: the set's root picks
}

TEST_CASE("TUTTI_SHM_BUFFER_BYTES: auto or a size in range") {
  Env automatic = {{"TUTTI_SHM_BUFFER_BYTES", "auto"}}, sized = {{"TUTTI_SHM_BUFFER_BYTES", "65536"}};
  CHECK(parseConfig(&automatic).shm_buffer_bytes == 0);
  CHECK(parseConfig(&sized).shm_buffer_bytes == 65536);
  Env small = {{"TUTTI_SHM_BUFFER_BYTES", "4096"}}, word = {{"TUTTI_SHM_BUFFER_BYTES", "big"}};
  CHECK_THROWS_WITH(parseConfig(&small), Catch::Contains("TUTTI_SHM_BUFFER_BYTES='4096'"));
  CHECK_THROWS_WITH(parseConfig(&word), Catch::Contains("TUTTI_SHM_BUFFER_BYTES='big'"));
}

TEST_CASE("config parses every kind of value") {
  Env env = {{"TUTTI_FUSION_THRESHOLD", "1048576"}, {"TUTTI_CYCLE_TIME_MS", "2.5"},
             {"TUTTI_CPU_OPERATIONS", "gloo"},      {"TUTTI_TIMEOUT_SECONDS", "30"},
             {"TUTTI_LOG_LEVEL", "debug"},          {"TUTTI_STALL_CHECK_DISABLE", "1"},
             {"TUTTI_CACHE_CAPACITY", "0"},         {"TUTTI_START_TIMEOUT_SECONDS", "7"}};
  Config c = parseConfig(&env);
  CHECK(c.start_timeout_seconds == 7);
  CHECK(c.fusion_threshold == 1048576);
  CHECK(c.cycle_time_ms == 2.5);
  CHECK(c.cpu_operations == "gloo");
  CHECK(c.timeout_seconds == 30);
  CHECK(c.log_level == LogLevel::kDebug);
  CHECK(c.stall_check_disable);
  CHECK(c.cache_capacity == 0);
}

TEST_CASE("an empty value counts as unset: the default, never a silent false") {
  Env env = {{"TUTTI_SHM", ""}, {"TUTTI_HIERARCHICAL_ALLREDUCE", ""}, {"TUTTI_CYCLE_TIME_MS", ""},
             {"TUTTI_CACHE_CAPACITY", ""}, {"TUTTI_LOG_LEVEL", ""}, {"HOROVOD_AUTOTUNE", ""}};
  Config c = parseConfig(&env);
  CHECK(c.shm);  // the default 1, not false
  CHECK(c.hierarchical_allreduce);
  CHECK_FALSE(c.autotune);
  CHECK(c.cycle_time_ms == 1.0);
  CHECK(c.cache_capacity == 1024);
  CHECK(c.log_level == LogLevel::kWarning);
  CHECK(c.given.empty());  // tutti-info says "(default)"
  for (const auto& line : settingsInForce(c))
    if (line.rfind("TUTTI_SHM=", 0) == 0) CHECK(line == "TUTTI_SHM=1 (default)");
}

TEST_CASE("the table says for every variable whose value counts across ranks") {
  std::vector<std::string> must_agree;
  for (const auto& var : configTable())
    if (var.across == AcrossRanks::kMustAgree) must_agree.push_back(var.name);
  CHECK(must_agree == std::vector<std::string>{"TUTTI_FUSION_THRESHOLD", "TUTTI_CACHE_CAPACITY",
                                               "TUTTI_AUTOTUNE"});
  const std::string table = configMarkdown();
  CHECK(table.find("| Variable | Type | Default | Range | Across ranks | Meaning |") == 0);
  CHECK(table.find("| `TUTTI_CACHE_CAPACITY` | int | 1024 | [0, 1048576] | must agree (checked "
                   "at init) |") != std::string::npos);
  CHECK(table.find("| `TUTTI_HIERARCHICAL_ALLREDUCE` | bool | 1 | 0, 1 | the set's first "
                   "rank's |") != std::string::npos);
}

TEST_CASE("a bad value is an error naming the variable, the value and what was expected") {
  auto message = [](Env env) {
    try {
      parseConfig(&env);
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message({{"TUTTI_CYCLE_TIME_MS", "abc"}}) ==
        "TUTTI_CYCLE_TIME_MS='abc': expected a number in [0, 10000]");
  CHECK(message({{"TUTTI_FUSION_THRESHOLD", "-1"}}).find("TUTTI_FUSION_THRESHOLD='-1'") == 0);
  CHECK(message({{"TUTTI_FUSION_THRESHOLD", "12kb"}}).find("an integer") != std::string::npos);
  CHECK(message({{"TUTTI_CPU_OPERATIONS", "nccl"}}) ==
        "TUTTI_CPU_OPERATIONS='nccl': expected one of mpi, gloo, loopback");
  CHECK(message({{"TUTTI_LOG_LEVEL", "loud"}}).find("one of trace, debug") != std::string::npos);
  CHECK(message({{"TUTTI_STALL_CHECK_DISABLE", "maybe"}}).find("TUTTI_STALL_CHECK_DISABLE") == 0);
  CHECK(message({{"TUTTI_RANK", "5"}, {"TUTTI_SIZE", "4"}}).find("TUTTI_RANK='5'") == 0);
}

TEST_CASE("rank and size come from tuttirun, then Open MPI, then Slurm") {
  Env tutti = {{"TUTTI_RANK", "3"},       {"TUTTI_SIZE", "4"},       {"TUTTI_LOCAL_RANK", "1"},
               {"TUTTI_LOCAL_SIZE", "2"}, {"TUTTI_CROSS_RANK", "1"}, {"TUTTI_CROSS_SIZE", "2"},
               {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "9"}};
  Topology t = parseConfig(&tutti).topology;
  CHECK(t.source == "tuttirun");
  CHECK((t.rank == 3 && t.size == 4 && t.local_rank == 1 && t.local_size == 2 &&
         t.cross_rank == 1 && t.cross_size == 2 && t.local_given && t.cross_given));

  Env ompi = {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  t = parseConfig(&ompi).topology;
  CHECK(t.source == "Open MPI");
  CHECK((t.rank == 2 && t.size == 3 && t.local_rank == 2 && t.local_size == 3));
  CHECK((t.local_given && !t.cross_given));  // Open MPI has no cross rank: measured

  // Plain `srun -n 3`: no SLURM_NTASKS_PER_NODE; local values are measured, not parsed.
  Env slurm = {{"SLURM_PROCID", "1"},         {"SLURM_STEP_NUM_TASKS", "3"},
               {"SLURM_NTASKS", "3"},         {"SLURM_LOCALID", "1"},
               {"SLURM_NODEID", "0"},         {"SLURM_NNODES", "1"},
               {"SLURM_STEP_ID", "0"},        {"SLURM_JOB_ID", "17"},
               {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURMD_NODENAME", "n1"}};
  Config c = parseConfig(&slurm);
  t = c.topology;
  CHECK(t.source == "Slurm");
  CHECK((t.rank == 1 && t.size == 3 && !t.local_given && !t.cross_given));
  CHECK((c.slurm.job_id == "17" && c.slurm.step_id == "0" && c.slurm.node_list == "n[1-2]" &&
         c.slurm.node_id == 0 && c.slurm.node_name == "n1" && !c.slurm.pmi));
  slurm["PMIX_RANK"] = "1";
  CHECK(parseConfig(&slurm).slurm.pmi);

  // A program run straight from an sbatch script (no job step) is one process, although
  // Slurm sets SLURM_PROCID=0 and the job's SLURM_NTASKS there.
  Env batch = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_ID", "17"}};
  t = parseConfig(&batch).topology;
  CHECK((t.source == "single process" && t.rank == 0 && t.size == 1));
}

TEST_CASE("an elastic worker's rank and size come from the rendezvous, not the environment") {
  Env env = {{"TUTTI_ELASTIC_WORKER", "w7"}, {"TUTTI_ELASTIC_GENERATION", "3"},
             {"TUTTI_ELASTIC_TIMEOUT", "45"}, {"TUTTI_RANK", "1"}, {"TUTTI_SIZE", "4"}};
  Config c = parseConfig(&env);
  CHECK(c.topology.source == "tuttirun elastic");
  CHECK((c.elastic.id == "w7" && c.elastic.first_generation == 3 &&
         c.elastic.timeout_seconds == 45));
  env["TUTTI_ELASTIC_TIMEOUT"] = "soon";
  CHECK_THROWS_WITH(parseConfig(&env), Catch::Contains("TUTTI_ELASTIC_TIMEOUT='soon'"));
  Env plain = {{"TUTTI_RANK", "1"}, {"TUTTI_SIZE", "4"}};
  CHECK(parseConfig(&plain).elastic.id.empty());
}

TEST_CASE("the secret can come from a file") {
  std::string path = "/tmp/tutti_config_test_secret";
  std::ofstream(path) << "abcdef0123\n";
  Env env = {{"TUTTI_SECRET_FILE", path}};
  CHECK(parseConfig(&env).secret == "abcdef0123");
  Env both = {{"TUTTI_SECRET", "fromenv"}, {"TUTTI_SECRET_FILE", path}};
  CHECK(parseConfig(&both).secret == "fromenv");
  Env missing = {{"TUTTI_SECRET_FILE", "/nonexistent/secret"}};
  CHECK_THROWS_AS(parseConfig(&missing), Error);
}

TEST_CASE("docs/env_vars.md lists every variable of the config table") {
  const std::string doc = envVarsDoc();
  for (const auto& var : configTable()) {
    INFO(var.name);
    CHECK(doc.find(std::string("`") + var.name + "`") != std::string::npos);
  }
  CHECK(configMarkdown().find("| `TUTTI_CYCLE_TIME_MS` | float | 1 |") != std::string::npos);
}

TEST_CASE("HOROVOD_ variables are read as their TUTTI_ twins; a TUTTI_ value wins") {
  Env env = {{"HOROVOD_FUSION_THRESHOLD", "2097152"}, {"HOROVOD_CYCLE_TIME", "3.5"},
             {"HOROVOD_CPU_OPERATIONS", "GLOO"},     {"HOROVOD_LOG_LEVEL", "DEBUG"},
             {"HOROVOD_GLOO_TIMEOUT_SECONDS", "45"}, {"HOROVOD_CACHE_CAPACITY", "5"},
             {"HOROVOD_STALL_CHECK_DISABLE", "1"},   {"HOROVOD_TIMELINE", "/tmp/h.json"},
             {"HOROVOD_GLOO_IFACE", "eth9"},         {"HOROVOD_STALL_CHECK_TIME_SECONDS", "7"},
             {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9"}};
  Config c = parseConfig(&env);
  CHECK(c.fusion_threshold == 2097152);
  CHECK(c.cycle_time_ms == 3.5);
  CHECK(c.cpu_operations == "gloo");
  CHECK(c.log_level == LogLevel::kDebug);
  CHECK(c.start_timeout_seconds == 45);
  CHECK(c.cache_capacity == 5);
  CHECK(c.stall_check_disable);
  CHECK(c.timeline_filename == "/tmp/h.json");
  CHECK(c.gloo_iface == "eth9");
  CHECK(c.stall_check_seconds == 7);
  CHECK(c.stall_shutdown_seconds == 9);

  Env both = {{"HOROVOD_CYCLE_TIME", "3.5"}, {"TUTTI_CYCLE_TIME_MS", "7"}};
  CHECK(parseConfig(&both).cycle_time_ms == 7);

  Env bad = {{"HOROVOD_CYCLE_TIME", "fast"}};
  CHECK_THROWS_WITH(parseConfig(&bad),
                    Catch::Contains("HOROVOD_CYCLE_TIME (read as TUTTI_CYCLE_TIME_MS)"));
  Env upper = {{"TUTTI_LOG_LEVEL", "Info"}};
  CHECK(parseConfig(&upper).log_level == LogLevel::kInfo);
}

TEST_CASE("every HOROVOD_ twin names a variable of the table and is documented") {
  const std::string doc = envVarsDoc();
  for (const auto& twin : horovodTwins()) {
    INFO(twin.horovod);
    bool known = false;
    for (const auto& var : configTable()) known = known || std::string(var.name) == twin.tutti;
    CHECK(known);
    CHECK(doc.find(std::string("`") + twin.horovod + "`") != std::string::npos);
  }
}

namespace {

// Every field of BackendOptions (backends/options.h) as "name=value": a failed CHECK shows
// which one differs.
std::vector<std::string> fields(const BackendOptions& o) {
  std::vector<std::string> out;
  auto add = [&out](const char* name, const auto& value) {
    std::ostringstream s;
    s << name << "=" << value;
    out.push_back(s.str());
  };
  add("rank", o.rank), add("size", o.size), add("local_rank", o.local_rank);
  add("launcher", o.launcher), add("cpu_operations", o.cpu_operations);
  add("timeout_seconds", o.timeout_seconds);
  add("start_timeout_seconds", o.start_timeout_seconds);
  add("rendezvous_addr", o.rendezvous_addr), add("rendezvous_port", o.rendezvous_port);
  add("secret", o.secret), add("gloo_iface", o.gloo_iface);
  add("slurm.job_id", o.slurm.job_id), add("slurm.step_id", o.slurm.step_id);
  add("slurm.node_list", o.slurm.node_list), add("slurm.node_id", o.slurm.node_id);
  add("slurm.node_name", o.slurm.node_name), add("slurm.pmi", o.slurm.pmi);
  add("slurm.home", o.slurm.home), add("elastic.id", o.elastic.id);
  add("hosted.launcher", o.hosted.launcher), add("hosted.host", o.hosted.host);
  add("hosted.host_from", o.hosted.host_from), add("hosted.port", o.hosted.port);
  add("hosted.port_from", o.hosted.port_from), add("hosted.identity", o.hosted.identity);
  add("hosted.one_host", o.hosted.one_host), add("hosted.home", o.hosted.home);
  add("hosted.missing", o.hosted.missing);
  add("elastic.first_generation", o.elastic.first_generation);
  add("elastic.timeout_seconds", o.elastic.timeout_seconds);
  add("shm", o.shm), add("shm_buffer_bytes", o.shm_buffer_bytes);
  add("hierarchical_allreduce", o.hierarchical_allreduce);
  add("hierarchical_allgather", o.hierarchical_allgather);
  return out;
}

}  // namespace

TEST_CASE("the backends' options default to the config's defaults") {
  Env env;
  CHECK(fields(backendOptions(parseConfig(&env))) == fields(BackendOptions()));
}

TEST_CASE("backendOptions carries every setting the backends read") {
  Env env = {{"TUTTI_RANK", "3"}, {"TUTTI_SIZE", "4"}, {"TUTTI_LOCAL_RANK", "1"},
             {"TUTTI_LOCAL_SIZE", "2"}, {"TUTTI_CPU_OPERATIONS", "gloo"},
             {"TUTTI_TIMEOUT_SECONDS", "30"}, {"TUTTI_START_TIMEOUT_SECONDS", "7"},
             {"TUTTI_RENDEZVOUS_ADDR", "10.1.2.3"}, {"TUTTI_RENDEZVOUS_PORT", "4567"},
             {"TUTTI_SECRET", "00112233445566778899aabbccddeeff"}, {"TUTTI_GLOO_IFACE", "eth1"},
             {"TUTTI_SHM", "0"}, {"TUTTI_SHM_BUFFER_BYTES", "65536"},
             {"TUTTI_HIERARCHICAL_ALLREDUCE", "0"}, {"TUTTI_HIERARCHICAL_ALLGATHER", "0"}};
  BackendOptions want;
  want.rank = 3;
  want.size = 4;
  want.local_rank = 1;
  want.launcher = "tuttirun";
  want.cpu_operations = "gloo";
  want.timeout_seconds = 30;
  want.start_timeout_seconds = 7;
  want.rendezvous_addr = "10.1.2.3";
  want.rendezvous_port = 4567;
  want.secret = "00112233445566778899aabbccddeeff";
  want.gloo_iface = "eth1";
  want.shm = false;
  want.shm_buffer_bytes = 65536;
  want.hierarchical_allreduce = want.hierarchical_allgather = false;
  CHECK(fields(backendOptions(parseConfig(&env))) == fields(want));

  Env elastic = {{"TUTTI_ELASTIC_WORKER", "w7"}, {"TUTTI_ELASTIC_GENERATION", "3"},
                 {"TUTTI_ELASTIC_TIMEOUT", "45"}, {"TUTTI_RANK", "1"}, {"TUTTI_SIZE", "4"}};
  const BackendOptions e = backendOptions(parseConfig(&elastic));
  CHECK((e.launcher == "tuttirun elastic" && e.elastic.id == "w7" &&
         e.elastic.first_generation == 3 && e.elastic.timeout_seconds == 45));

  Env slurm = {{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_NTASKS", "3"},
               {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_ID", "17"}, {"SLURM_NODEID", "0"},
               {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURMD_NODENAME", "n1"},
               {"PMIX_RANK", "1"}, {"HOME", "/home/u"}};
  const BackendOptions s = backendOptions(parseConfig(&slurm));
  CHECK((s.launcher == "Slurm" && s.rank == 1 && s.size == 3 && s.slurm.job_id == "17" &&
         s.slurm.step_id == "0" && s.slurm.node_list == "n[1-2]" && s.slurm.node_id == 0 &&
         s.slurm.node_name == "n1" && s.slurm.pmi && s.slurm.home == "/home/u"));
}
