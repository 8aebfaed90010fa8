// Every TUTTI_* setting, parsed once at init from one table (name, type, default, range,
// help). docs/env_vars.md lists the same table; a test keeps the two in step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tutti {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::string source = "single process";  // "tuttirun", "Open MPI", "Slurm", ...
  // Whether the launcher gave local (cross) rank and size. Either way they are measured at
  // init (core/topology.h); values the launcher gave must agree with the measurement.
  bool local_given = false, cross_given = false;
};

struct Config {
  int64_t fusion_threshold = 128ll << 20;
  double cycle_time_ms = 1.0;
  std::string cpu_operations;  // "mpi", "gloo", "loopback"; empty = pick from the launcher
  double timeout_seconds = 1800.0;       // collectives and waits
  double start_timeout_seconds = 30.0;   // connecting (rendezvous, process sets)
  LogLevel log_level = LogLevel::kWarning;
  int64_t cache_capacity = 1024;
  double stall_check_seconds = 60.0;
  bool stall_check_disable = false;
  double stall_shutdown_seconds = 0.0;
  std::string timeline_filename;
  std::string gloo_iface;
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  std::string secret;       // job secret (TUTTI_SECRET or read from TUTTI_SECRET_FILE)
  bool shm = true;                        // shm backend for sets on one host (TUTTI_SHM)
  int64_t shm_buffer_bytes = 1ll << 20;   // per member and buffer (TUTTI_SHM_BUFFER_BYTES)
  Topology topology;
};

struct ConfigVar {
  const char* name;
  const char* type;     // "bytes", "int", "float", "string", "bool", "enum"
  const char* default_text;
  const char* range;    // human-readable range or choices
  const char* help;
  // Parses `value` into the config; throws Error(kInvalidArgument) naming the variable.
  std::function<void(const std::string& value, Config& config)> parse;
};

const std::vector<ConfigVar>& configTable();

// Reads every variable of the table from `env` (the process environment when null) and the
// topology from tuttirun, Open MPI or Slurm variables. Throws Error(kInvalidArgument) on the
// first bad value: "TUTTI_CYCLE_TIME_MS='abc': expected a number in [0, 10000]".
Config parseConfig(const std::map<std::string, std::string>* env = nullptr);

// The table rendered as a Markdown table (docs/env_vars.md embeds it).
std::string configMarkdown();

const char* logLevelName(LogLevel level);

}  // namespace tutti
