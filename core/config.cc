#include "core/config.h"

#include "core/launcher_env.h"

#include "base/common.h"
#include "base/logging.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

extern char** environ;

namespace tutti {
namespace {

[[noreturn]] void badValue(const char* name, const std::string& value, const std::string& expected) {
  throwError(StatusCode::kInvalidArgument,
             std::string(name) + "='" + value + "': expected " + expected);
}

double parseDouble(const char* name, const std::string& value, double lo, double hi) {
  std::ostringstream expected;
  expected << "a number in [" << lo << ", " << hi << "]";
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0' || !(v >= lo && v <= hi))
    badValue(name, value, expected.str());
  return v;
}

int64_t parseInt(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  std::ostringstream expected;
  expected << "an integer in [" << lo << ", " << hi << "]";
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0' || v < lo || v > hi)
    badValue(name, value, expected.str());
  return v;
}

bool parseBool(const char* name, const std::string& value) {
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  badValue(name, value, "one of 1, 0, true, false, yes, no, on, off");
}

// Case-insensitive (Horovod writes HOROVOD_LOG_LEVEL=INFO); returns the choice as listed.
std::string parseChoice(const char* name, const std::string& value,
                        const std::vector<std::string>& choices) {
  std::string lower = value;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string all;
  for (const auto& c : choices) {
    if (c == lower) return c;
    all += (all.empty() ? "" : ", ") + c;
  }
  badValue(name, value, "one of " + all);
}

const std::vector<std::string> kLogLevels = [] {
  std::vector<std::string> names;
  for (int i = 0; i < kNumLogLevels; ++i) names.push_back(logLevelName(static_cast<LogLevel>(i)));
  return names;
}();

}  // namespace

int64_t parseIntVariable(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  return parseInt(name, value, lo, hi);
}

double parseDoubleVariable(const char* name, const std::string& value, double lo, double hi) {
  return parseDouble(name, value, lo, hi);
}

const std::vector<ConfigVar>& configTable() {
  static const std::vector<ConfigVar> table = {
      {"TUTTI_FUSION_THRESHOLD", "bytes", "134217728", "[0, 2^40]",
       "Largest fused allreduce buffer in bytes; 0 disables fusion.",
       [](const std::string& v, Config& c) {
         c.fusion_threshold = parseInt("TUTTI_FUSION_THRESHOLD", v, 0, int64_t(1) << 40);
       },
       AcrossRanks::kMustAgree,
       [](const Config& c) { return std::to_string(c.fusion_threshold); }},
      {"TUTTI_CYCLE_TIME_MS", "float", "1", "[0, 10000]",
       "Longest an idle rank waits before joining a negotiation round that others may have "
       "started; work enqueued wakes the coordinator at once. Idle ranks back off up to 32x.",
       [](const std::string& v, Config& c) {
         c.cycle_time_ms = parseDouble("TUTTI_CYCLE_TIME_MS", v, 0, 10000);
       }},
      {"TUTTI_PIPELINE", "enum", "auto", "auto, 0, 1",
       "Pipelined rounds: the execution stream's thread runs each round's collectives while "
       "the background thread negotiates the next round; 0: the background thread does both "
       "in turn. auto: on where the host has at least 3 cores per rank on it (the caller's, "
       "the background and the stream's thread), else off (measured slower on 2 cores, "
       "docs/PERFORMANCE.md). Local to each rank.",
       [](const std::string& v, Config& c) {
         c.pipeline = parseChoice("TUTTI_PIPELINE", v, {"auto", "0", "1"});
       }},
      {"TUTTI_CPU_OPERATIONS", "enum", "(from the launcher)", "mpi, gloo, loopback",
       "Backend for CPU tensors and negotiation. Default: mpi under mpirun, gloo under "
       "tuttirun --gloo, gloo under torchrun and hydra, loopback for a single process; under "
       "srun mpi when this build has it, else gloo (set gloo to run without MPI: rank 0 then "
       "hosts the rendezvous).",
       [](const std::string& v, Config& c) {
         c.cpu_operations = parseChoice("TUTTI_CPU_OPERATIONS", v, {"mpi", "gloo", "loopback"});
       }, AcrossRanks::kConnect},
      {"TUTTI_SHM", "bool", "1", "0, 1",
       "Shared memory for the negotiation and the CPU collectives of process sets whose "
       "members all run on one host (measured at init, under any launcher); 0 leaves both to "
       "the transport (mpi or gloo).",
       [](const std::string& v, Config& c) { c.shm = parseBool("TUTTI_SHM", v); },
       AcrossRanks::kAnyOff},
      {"TUTTI_SHM_BUFFER_BYTES", "bytes", "auto", "auto, [65536, 2^30]",
       "Bytes of each shm buffer per member and process set (each set maps 2 x members x "
       "this in /dev/shm); collectives larger than this move in chunks of it. auto: 4 MiB up "
       "to 8 members, then 32 MiB / members (at least 1 MiB), halved while /dev/shm has no "
       "room for it (down to 64 KiB).",
       [](const std::string& v, Config& c) {
         c.shm_buffer_bytes =
             v == "auto" ? 0 : parseInt("TUTTI_SHM_BUFFER_BYTES", v, 65536, int64_t(1) << 30);
       }, AcrossRanks::kAnyOff},
      {"TUTTI_HIERARCHICAL_ALLREDUCE", "bool", "1", "0, 1",
       "Allreduce of process sets that span hosts with the same number (> 1) of members on "
       "each: reduce-scatter over shm inside each host, allreduce of each slice across hosts "
       "among the ranks of the same local rank, allgather over shm (measured faster at every "
       "size, docs/PERFORMANCE.md); 0: one flat ring. The set's first rank's value counts.",
       [](const std::string& v, Config& c) {
         c.hierarchical_allreduce = parseBool("TUTTI_HIERARCHICAL_ALLREDUCE", v);
       }, AcrossRanks::kFirstMember},
      {"TUTTI_HIERARCHICAL_ALLGATHER", "bool", "1", "0, 1",
       "Allgather(v) of process sets that span hosts with the same number (> 1) of members "
       "on each: allgather across hosts among the ranks of the same local rank, then over "
       "shm inside each host (measured faster over 1 Gbit/s links, docs/PERFORMANCE.md, "
       "\"Hierarchical allgather\"); 0: the flat ring. Fixed when the set is made; the set's "
       "first rank's value counts.",
       [](const std::string& v, Config& c) {
         c.hierarchical_allgather = parseBool("TUTTI_HIERARCHICAL_ALLGATHER", v);
       }, AcrossRanks::kFirstMember},
      {"TUTTI_TIMEOUT_SECONDS", "float", "1800", "[0.1, 1e9]",
       "Deadline of the job's collective waits: negotiation, each collective, and tutti_wait "
       "without a timeout. A tensor some ranks submitted and others did not for this long "
       "stops the job on every rank with an error naming the op, the tensor, the process set "
       "and the ranks that did not arrive. 30 minutes, like torch.distributed, so that "
       "rank-0-only work (evaluation, checkpoints) does not kill training.",
       [](const std::string& v, Config& c) {
         c.timeout_seconds = parseDouble("TUTTI_TIMEOUT_SECONDS", v, 0.1, 1e9);
       }},
      {"TUTTI_START_TIMEOUT_SECONDS", "float", "30", "[0.1, 1e9]",
       "Deadline of connecting: the rendezvous, the connections of each process set and its "
       "communicators (tuttirun --start-timeout).",
       [](const std::string& v, Config& c) {
         c.start_timeout_seconds = parseDouble("TUTTI_START_TIMEOUT_SECONDS", v, 0.1, 1e9);
       }},
      {"TUTTI_LOG_LEVEL", "enum", "warning", "trace, debug, info, warning, error, fatal",
       "Messages at this level and above go to stderr, prefixed with the rank; any case "
       "(INFO = info). info: the settings in force, topology and backends, once (rank 0); "
       "debug: the same on every rank and each round's decisions; trace: every op.",
       [](const std::string& v, Config& c) {
         const std::string level = parseChoice("TUTTI_LOG_LEVEL", v, kLogLevels);
         c.log_level = static_cast<LogLevel>(
             std::find(kLogLevels.begin(), kLogLevels.end(), level) - kLogLevels.begin());
       }},
      {"TUTTI_LOG_HIDE_TIME", "bool", "1", "0, 1",
       "0: each log line starts with the local date and time to the microsecond "
       "(2026-05-01 12:00:00.123456 [tutti info rank 0] ...; tuttirun --log-with-timestamp); "
       "1: no time (tuttirun --log-without-timestamp). Horovod's default is 0, Tutti's 1.",
       [](const std::string& v, Config& c) {
         c.log_hide_time = parseBool("TUTTI_LOG_HIDE_TIME", v);
       }},
      {"TUTTI_CACHE_CAPACITY", "int", "1024", "[0, 1048576]",
       "Response cache entries per process set; 0 disables the cache (every op is negotiated "
       "with a gather and a broadcast).",
       [](const std::string& v, Config& c) {
         c.cache_capacity = parseInt("TUTTI_CACHE_CAPACITY", v, 0, 1 << 20);
       },
       AcrossRanks::kMustAgree,
       [](const Config& c) { return std::to_string(c.cache_capacity); }},
      {"TUTTI_STALL_CHECK_TIME_SECONDS", "float", "60", "[0, 1e9]",
       "Rank 0 warns about a tensor submitted by some ranks but not all for this long, "
       "naming the missing ranks.",
       [](const std::string& v, Config& c) {
         c.stall_check_seconds = parseDouble("TUTTI_STALL_CHECK_TIME_SECONDS", v, 0, 1e9);
       }, AcrossRanks::kRankZero},
      {"TUTTI_STALL_CHECK_DISABLE", "bool", "0", "0, 1",
       "Turns the stall warnings off.",
       [](const std::string& v, Config& c) {
         c.stall_check_disable = parseBool("TUTTI_STALL_CHECK_DISABLE", v);
       }, AcrossRanks::kRankZero},
      {"TUTTI_STALL_SHUTDOWN_TIME_SECONDS", "float", "0", "[0, 1e9]",
       "When > 0, a tensor stalled this long stops the job on every rank with an error "
       "naming it and the missing ranks.",
       [](const std::string& v, Config& c) {
         c.stall_shutdown_seconds = parseDouble("TUTTI_STALL_SHUTDOWN_TIME_SECONDS", v, 0, 1e9);
       }, AcrossRanks::kRankZero},
      {"TUTTI_TIMELINE", "string", "(off)", "a directory/ or a file path",
       "Writes a Chrome trace (chrome://tracing, Perfetto) of every op's phases. A "
       "directory (ending in / or existing): every rank writes dir/rank-N.json (merge them "
       "with tutti-timeline merge); a file path: rank 0 only, as Horovod's "
       "HOROVOD_TIMELINE. DYNAMIC: none until start_timeline.",
       [](const std::string& v, Config& c) { c.timeline_filename = v; }},
      {"TUTTI_TIMELINE_MARK_CYCLES", "bool", "0", "0, 1",
       "Marks every round (CYCLE_START) on the timeline's rounds row "
       "(tuttirun --timeline-mark-cycles).",
       [](const std::string& v, Config& c) {
         c.timeline_mark_cycles = parseBool("TUTTI_TIMELINE_MARK_CYCLES", v);
       }},
      {"TUTTI_STATS", "bool", "0", "0, 1",
       "Each rank prints its counters (ops and bytes by op and backend, fused batches, cache "
       "hits, time per phase) to stderr at shutdown.",
       [](const std::string& v, Config& c) { c.print_stats = parseBool("TUTTI_STATS", v); }},
      {"TUTTI_AUTOTUNE", "bool", "0", "0, 1",
       "Tunes TUTTI_FUSION_THRESHOLD, TUTTI_CYCLE_TIME_MS, the response cache on/off and "
       "hierarchical allreduce on/off (where the job has it) while the job runs, by the bytes "
       "per second of measured windows (tuttirun --autotune; docs/PERFORMANCE.md).",
       [](const std::string& v, Config& c) { c.autotune = parseBool("TUTTI_AUTOTUNE", v); },
       AcrossRanks::kMustAgree,
       [](const Config& c) { return std::string(c.autotune ? "1" : "0"); }},
      {"TUTTI_AUTOTUNE_LOG", "string", "(none)", "a file path",
       "Rank 0 writes every autotune window there as CSV (tuttirun --autotune-log-file).",
       [](const std::string& v, Config& c) { c.autotune_log = v; }, AcrossRanks::kRankZero},
      {"TUTTI_AUTOTUNE_WINDOW_SECONDS", "float", "0.5", "[0.001, 3600]",
       "Length of one autotune window.",
       [](const std::string& v, Config& c) {
         c.autotune_window_seconds = parseDouble("TUTTI_AUTOTUNE_WINDOW_SECONDS", v, 0.001, 3600);
       }, AcrossRanks::kRankZero},
      {"TUTTI_AUTOTUNE_WARMUP_WINDOWS", "int", "3", "[0, 1000]",
       "Windows at the start that autotune does not score.",
       [](const std::string& v, Config& c) {
         c.autotune_warmup_windows =
             static_cast<int>(parseInt("TUTTI_AUTOTUNE_WARMUP_WINDOWS", v, 0, 1000));
       }, AcrossRanks::kRankZero},
      {"TUTTI_AUTOTUNE_SAMPLES", "int", "3", "[1, 1000]",
       "Windows scored per candidate setting (the median counts).",
       [](const std::string& v, Config& c) {
         c.autotune_samples = static_cast<int>(parseInt("TUTTI_AUTOTUNE_SAMPLES", v, 1, 1000));
       }, AcrossRanks::kRankZero},
      {"TUTTI_GLOO_IFACE", "string", "(the rendezvous route)", "an interface name",
       "Network interface for gloo's TCP pairs (tuttirun --network-interface).",
       [](const std::string& v, Config& c) { c.gloo_iface = v; }},
      {"TUTTI_RENDEZVOUS_ADDR", "string", "(unset)", "host or IP",
       "Address of tuttirun's rendezvous server (set by tuttirun). Under srun, torchrun or "
       "hydra with gloo: the address at which the other ranks reach rank 0's server "
       "(default: the first node of SLURM_STEP_NODELIST; MASTER_ADDR; 127.0.0.1 for hydra "
       "on one host, required across hosts).",
       [](const std::string& v, Config& c) { c.rendezvous_addr = v; }, AcrossRanks::kConnect},
      {"TUTTI_RENDEZVOUS_PORT", "int", "0", "[0, 65535]",
       "Port of tuttirun's rendezvous server (set by tuttirun). Under srun, torchrun or hydra "
       "with gloo: the port rank 0's server listens on (default: 20000 + (SLURM_JOB_ID mod "
       "750) * 16 + SLURM_STEP_ID mod 16; MASTER_PORT + 1; required for hydra).",
       [](const std::string& v, Config& c) {
         c.rendezvous_port = static_cast<int>(parseInt("TUTTI_RENDEZVOUS_PORT", v, 0, 65535));
       }, AcrossRanks::kConnect},
      {"TUTTI_SECRET", "string", "(unset)", "hex string",
       "The job's rendezvous secret, hex (set by tuttirun; never put it on a command line). "
       "Under srun with gloo: export it before srun or sbatch (at least 32 hex digits), or "
       "keep one in ~/.tutti/secret (mode 0600).",
       [](const std::string& v, Config& c) { c.secret = v; }, AcrossRanks::kConnect},
      {"TUTTI_SECRET_FILE", "string", "(unset)", "a file path",
       "File holding the job's secret, readable only by the user; used when TUTTI_SECRET is "
       "unset.",
       [](const std::string& v, Config& c) {
         if (!c.secret.empty() || v.empty()) return;
         std::ifstream in(v);
         if (!in) badValue("TUTTI_SECRET_FILE", v, "a readable file");
         std::getline(in, c.secret);
       }, AcrossRanks::kConnect},
  };
  return table;
}

const std::vector<HorovodTwin>& horovodTwins() {
  static const std::vector<HorovodTwin> twins = {
      {"HOROVOD_FUSION_THRESHOLD", "TUTTI_FUSION_THRESHOLD"},
      {"HOROVOD_CYCLE_TIME", "TUTTI_CYCLE_TIME_MS"},
      {"HOROVOD_CPU_OPERATIONS", "TUTTI_CPU_OPERATIONS"},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "TUTTI_START_TIMEOUT_SECONDS"},
      {"HOROVOD_LOG_LEVEL", "TUTTI_LOG_LEVEL"},
      {"HOROVOD_LOG_HIDE_TIME", "TUTTI_LOG_HIDE_TIME"},
      {"HOROVOD_CACHE_CAPACITY", "TUTTI_CACHE_CAPACITY"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "TUTTI_STALL_CHECK_TIME_SECONDS"},
      {"HOROVOD_STALL_CHECK_DISABLE", "TUTTI_STALL_CHECK_DISABLE"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "TUTTI_STALL_SHUTDOWN_TIME_SECONDS"},
      {"HOROVOD_TIMELINE", "TUTTI_TIMELINE"},
      {"HOROVOD_GLOO_IFACE", "TUTTI_GLOO_IFACE"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "TUTTI_TIMELINE_MARK_CYCLES"},
      {"HOROVOD_AUTOTUNE", "TUTTI_AUTOTUNE"},
      {"HOROVOD_AUTOTUNE_LOG", "TUTTI_AUTOTUNE_LOG"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "TUTTI_HIERARCHICAL_ALLREDUCE"},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", "TUTTI_HIERARCHICAL_ALLGATHER"},
  };
  return twins;
}

namespace {

// The environment with each HOROVOD_ twin copied to its TUTTI_ name where that is unset;
// `notes` says what was read or ignored, `from` maps a TUTTI_ name to the twin it came from.
std::map<std::string, std::string> withHorovodTwins(const std::map<std::string, std::string>& env,
                                                    std::vector<std::string>& notes,
                                                    std::map<std::string, std::string>& from) {
  std::map<std::string, std::string> out = env;
  for (const auto& twin : horovodTwins()) {
    auto h = env.find(twin.horovod);
    if (h == env.end()) continue;
    auto t = env.find(twin.tutti);
    if (t != env.end()) {
      if (t->second != h->second)
        notes.push_back(std::string(twin.horovod) + " ignored (" + twin.tutti + " is set)");
      continue;
    }
    out[twin.tutti] = h->second;
    from[twin.tutti] = twin.horovod;
    notes.push_back(std::string(twin.horovod) + " read as " + twin.tutti);
  }
  return out;
}

std::map<std::string, std::string> processEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace

Config parseConfig(const std::map<std::string, std::string>* env_in) {
  std::map<std::string, std::string> own;
  if (env_in == nullptr) own = processEnvironment();
  std::vector<std::string> notes;
  std::map<std::string, std::string> from;
  const auto env = withHorovodTwins(env_in ? *env_in : own, notes, from);
  Config config;
  for (const auto& var : configTable()) {
    auto it = env.find(var.name);
    // Empty counts as unset (`TUTTI_SHM= prog`, an unfilled template): the default applies.
    if (it == env.end() || it->second.empty()) continue;
    try {
      var.parse(it->second, config);
    } catch (const Error& e) {
      auto twin = from.find(var.name);
      if (twin == from.end()) throw;
      throwError(e.code(), twin->second + " (read as " + var.name + "): " + e.what());
    }
    config.given[var.name] = it->second;
  }
  auto launcher = env.find("TUTTI_LAUNCHER_SETTINGS");
  if (launcher != env.end()) {
    std::istringstream names(launcher->second);
    for (std::string name; std::getline(names, name, ',');)
      if (!name.empty()) config.from_launcher.push_back(name);
  }
  LauncherEnv launcher_env = parseLauncherEnv(env);
  config.topology = launcher_env.topology;
  config.slurm = launcher_env.slurm;
  config.hosted = launcher_env.hosted;
  config.elastic = launcher_env.elastic;
  // From rank 0 of a real job only (not for an environment a caller made up), one line each.
  if (env_in == nullptr && config.topology.rank == 0) {
    if (!notes.empty() && config.log_level <= LogLevel::kWarning) {
      std::string line;
      for (const auto& note : notes) line += (line.empty() ? "" : "; ") + note;
      logLine(LogLevel::kInfo, line + " (Horovod's variables count where the TUTTI_ one is "
                               "unset; docs/env_vars.md)");
    }
    // Once per process: an init after shutdown (or an elastic reset) does not repeat it.
    static std::atomic<bool> warned{false};
    auto warnings = environmentWarnings(own);
    warnings.insert(warnings.end(), launcher_env.unusable.begin(), launcher_env.unusable.end());
    if (!warnings.empty() && config.log_level <= LogLevel::kWarning && !warned.exchange(true)) {
      std::string line;
      for (const auto& w : warnings) line += (line.empty() ? "" : "; ") + w;
      logLine(LogLevel::kWarning, line + " (docs/env_vars.md)");
    }
  }
  return config;
}

std::vector<std::string> settingsInForce(const Config& config) {
  std::vector<std::string> lines;
  for (const auto& var : configTable()) {
    const std::string name = var.name;
    auto it = config.given.find(name);
    if (it == config.given.end()) {
      lines.push_back(name + "=" + var.default_text + " (default)");
      continue;
    }
    bool by_launcher = false;
    for (const auto& l : config.from_launcher) by_launcher = by_launcher || l == name;
    const bool secret = name == "TUTTI_SECRET";
    lines.push_back(name + "=" + (secret ? std::string("(set)") : it->second) +
                    (by_launcher ? " (tuttirun)" : " (environment)"));
  }
  return lines;
}

BackendOptions backendOptions(const Config& config) {
  BackendOptions o;
  o.rank = config.topology.rank;
  o.size = config.topology.size;
  o.local_rank = config.topology.local_rank;
  o.launcher = config.topology.source;
  o.cpu_operations = config.cpu_operations;
  o.timeout_seconds = config.timeout_seconds;
  o.start_timeout_seconds = config.start_timeout_seconds;
  o.rendezvous_addr = config.rendezvous_addr;
  o.rendezvous_port = config.rendezvous_port;
  o.secret = config.secret;
  o.gloo_iface = config.gloo_iface;
  o.slurm = config.slurm;
  o.hosted = config.hosted;
  o.elastic = config.elastic;
  o.store = config.store;
  o.shm = config.shm;
  o.shm_buffer_bytes = config.shm_buffer_bytes;
  o.hierarchical_allreduce = config.hierarchical_allreduce;
  o.hierarchical_allgather = config.hierarchical_allgather;
  return o;
}

const char* acrossRanksText(AcrossRanks across) {
  static const char* const texts[] = {
      "each rank's own", "must agree (checked at init)", "rank 0's", "the set's first rank's",
      "one set's members alike, else that set has no shm", "alike, or the ranks do not connect"};
  return texts[static_cast<int>(across)];
}

std::string configMarkdown() {
  std::ostringstream out;
  out << "| Variable | Type | Default | Range | Across ranks | Meaning |\n"
         "|---|---|---|---|---|---|\n";
  for (const auto& var : configTable())
    out << "| `" << var.name << "` | " << var.type << " | " << var.default_text << " | "
        << var.range << " | " << acrossRanksText(var.across) << " | " << var.help << " |\n";
  return out.str();
}

int usableCores() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return std::max(1, CPU_COUNT(&cpus));
}

}  // namespace tutti
