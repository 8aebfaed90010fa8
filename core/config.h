// Every TUTTI_* setting, parsed once at init from one table (name, type, default, range,
// help). docs/env_vars.md lists the same table; a test keeps the two in step.
#pragma once

#include "backends/options.h"
#include "base/logging.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tutti {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::string source = "single process";  // "tuttirun", "Open MPI", "Slurm", ...
  // Whether the launcher gave local (cross) rank and size. Either way they are measured at
  // init (core/topology.h); values the launcher gave must agree with the measurement.
  bool local_given = false, cross_given = false;
};

// ElasticWorker, SlurmStep and HostedRendezvous: backends/options.h (the backends read them).
struct Config {
  int64_t fusion_threshold = 128ll << 20;
  std::string pipeline = "auto";  // TUTTI_PIPELINE: auto, 0, 1 (Runtime::pipelined())
  double cycle_time_ms = 1.0;
  std::string cpu_operations;  // "mpi", "gloo", "loopback"; empty = pick from the launcher
  double timeout_seconds = 1800.0;       // collectives and waits
  double start_timeout_seconds = 30.0;   // connecting (rendezvous, process sets)
  LogLevel log_level = LogLevel::kWarning;
  bool log_hide_time = true;  // TUTTI_LOG_HIDE_TIME: 0 starts each log line with the time
  int64_t cache_capacity = 1024;
  double stall_check_seconds = 60.0;
  bool stall_check_disable = false;
  double stall_shutdown_seconds = 0.0;
  std::string timeline_filename;
  bool timeline_mark_cycles = false;
  bool print_stats = false;  // TUTTI_STATS: counters to stderr at shutdown
  bool autotune = false;
  std::string autotune_log;
  double autotune_window_seconds = 0.5;
  int autotune_warmup_windows = 3;
  int autotune_samples = 3;
  std::string gloo_iface;
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  std::string secret;       // job secret (TUTTI_SECRET or read from TUTTI_SECRET_FILE)
  bool shm = true;                        // shm backend for sets on one host (TUTTI_SHM)
  int64_t shm_buffer_bytes = 0;  // per member and buffer (TUTTI_SHM_BUFFER_BYTES); 0: auto
  bool hierarchical_allreduce = true;     // sets across hosts (TUTTI_HIERARCHICAL_ALLREDUCE)
  bool hierarchical_allgather = true;     // sets across hosts (TUTTI_HIERARCHICAL_ALLGATHER)
  Topology topology;
  SlurmStep slurm;          // set when topology.source == "Slurm"
  HostedRendezvous hosted;  // set when topology.source is "torchrun" or "hydra"
  ElasticWorker elastic;    // set when topology.source == "tuttirun elastic"
  std::shared_ptr<KeyValueStore> store;  // tutti_init_with_store's: the rendezvous
  // Where the settings came from (parseConfig): the variables the environment gave, with
  // their values, and those among them that tuttirun set from its flags
  // (TUTTI_LAUNCHER_SETTINGS, a comma-separated list tuttirun exports).
  std::map<std::string, std::string> given;
  std::vector<std::string> from_launcher;
};

// Whether ranks may differ on a setting, decided per variable by what would break if they did
// (docs/env_vars.md, "Settings across ranks").
enum class AcrossRanks : uint8_t {
  kOwn,          // each rank's own value counts (timing, logging, local files)
  kMustAgree,    // the bit layout or the fusion plan depends on it: checked at init
                 // (core/settings_agreement.h), a mismatch fails init on every rank
  kRankZero,     // only rank 0 (of the job, or of each process set) reads it
  kFirstMember,  // the process set's first rank's value counts, announced to the others
  kAnyOff,       // shm: a member with it off, or another value, makes its set do without
  kConnect,      // what the ranks connect with: a mismatch fails at connecting
};
const char* acrossRanksText(AcrossRanks across);

struct ConfigVar {
  const char* name;
  const char* type;     // "bytes", "int", "float", "string", "bool", "enum"
  const char* default_text;
  const char* range;    // human-readable range or choices
  const char* help;
  // Parses `value` into the config; throws Error(kInvalidArgument) naming the variable.
  std::function<void(const std::string& value, Config& config)> parse;
  AcrossRanks across = AcrossRanks::kOwn;
  // kMustAgree: the value in force, as ranks compare it ("1024", "0"): set only for those.
  std::function<std::string(const Config& config)> value = nullptr;
};

const std::vector<ConfigVar>& configTable();

// Horovod's name for a setting of the table. Where the TUTTI_ variable is unset its twin is
// read instead (a TUTTI_ value wins), so that jobs set up for Horovod (HOROVOD_* exported
// to mpirun or srun, say) keep their settings; rank 0 says so in one line.
struct HorovodTwin {
  const char* horovod;
  const char* tutti;
};
const std::vector<HorovodTwin>& horovodTwins();

// Reads every variable of the table (or its HOROVOD_ twin) from `env` (the process
// environment when null) and the topology from the launcher's variables
// (core/launcher_env.h). Rank 0 of a job read from the process environment warns once,
// in one line, of HOROVOD_ variables Tutti does not read and of misspelt TUTTI_ names
// (environmentWarnings).
// Throws Error(kInvalidArgument) on the first bad value: "TUTTI_CYCLE_TIME_MS='abc':
// expected a number in [0, 10000]" (a twin's: "HOROVOD_CYCLE_TIME (read as ...): ...").
Config parseConfig(const std::map<std::string, std::string>* env = nullptr);

// What rank 0 warns of at init: HOROVOD_ variables of Horovod's runtime that have no Tutti
// twin (horovodWithoutTwin) and TUTTI_ names that are not, but are close to, a variable of
// the table, one entry each in name order (parseConfig adds the launchers it cannot use,
// LauncherEnv::unusable, to the same line).
struct HorovodUnread {
  const char* horovod;
  const char* instead;  // what Tutti does or offers instead
};
const std::vector<HorovodUnread>& horovodWithoutTwin();
std::vector<std::string> environmentWarnings(const std::map<std::string, std::string>& env);

// The table's parsers, for the launchers' variables (core/launcher_env.cc): the same
// messages ("NAME='v': expected an integer in [lo, hi]").
int64_t parseIntVariable(const char* name, const std::string& value, int64_t lo, int64_t hi);
double parseDoubleVariable(const char* name, const std::string& value, double lo, double hi);

// One line per variable of the table: "TUTTI_X=value (default|environment|tuttirun)",
// secrets shown as "(set)". tutti-info prints them; init logs them at info.
std::vector<std::string> settingsInForce(const Config& config);

// The table rendered as a Markdown table (docs/env_vars.md embeds it).
std::string configMarkdown();

// What the backends read of `config` (backends/options.h): the one place it is made. A
// process set's backends are made from it after the topology is measured, so the NCCL
// backend picks its device by the measured local rank.
BackendOptions backendOptions(const Config& config);

// The CPUs this process may run on (its affinity mask; 1 if it cannot be read).
int usableCores();

}  // namespace tutti
