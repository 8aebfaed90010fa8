// What rank 0 warns of at init about the environment (core/config.h, environmentWarnings).
#include "core/config.h"

#include <algorithm>
#include <cctype>

namespace tutti {
namespace {

// The TUTTI_ variables that launchers set besides the table's (tuttirun's topology and
// elastic workers, the list of settings it made from flags).
const char* const kLauncherSet[] = {
    "TUTTI_RANK",       "TUTTI_SIZE",           "TUTTI_LOCAL_RANK",       "TUTTI_LOCAL_SIZE",
    "TUTTI_CROSS_RANK", "TUTTI_CROSS_SIZE",     "TUTTI_LAUNCHER_SETTINGS", "TUTTI_ELASTIC_WORKER",
    "TUTTI_ELASTIC_GENERATION", "TUTTI_ELASTIC_TIMEOUT"};

// Levenshtein distance, bounded: returns limit + 1 as soon as it must exceed `limit`.
size_t distance(const std::string& a, const std::string& b, size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t best = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
      best = std::min(best, row[j]);
    }
    if (best > limit) return limit + 1;
  }
  return row[b.size()];
}

// The variable of the table that `name` (a TUTTI_ name that is none of them) likely meant,
// or "": the same name in another case, a Horovod twin's name under TUTTI_
// (TUTTI_CYCLE_TIME), or one within 2 edits (1 for suffixes shorter than 6 characters).
std::string meant(const std::string& name) {
  std::string upper = name;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& twin : horovodTwins())
    if (upper == "TUTTI_" + std::string(twin.horovod).substr(8)) return twin.tutti;
  std::string best;
  size_t best_distance = 3;
  for (const auto& var : configTable()) {
    const std::string candidate = var.name;
    if (upper == candidate) return candidate;
    const size_t limit = candidate.size() - 6 < 6 ? 1 : 2;
    const size_t d = distance(upper, candidate, limit);
    if (d <= limit && d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace

// Horovod 0.28's runtime variables without a twin in the table (horovodTwins()).
const std::vector<HorovodUnread>& horovodWithoutTwin() {
  static const std::vector<HorovodUnread> names = {
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE",
       "tutti.torch's Adasum runs over alltoall, with no chunk size"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
       "Tutti's autotune is a coordinate search; TUTTI_AUTOTUNE_SAMPLES sets the windows per "
       "candidate"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "Tutti's autotune is a coordinate search"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
       "Tutti's autotune scores windows of TUTTI_AUTOTUNE_WINDOW_SECONDS"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
       "use TUTTI_AUTOTUNE_WARMUP_WINDOWS, which counts windows"},
      {"HOROVOD_BATCH_D2D_MEMCOPIES", "Tutti has no such switch"},
      {"HOROVOD_CCL_CACHE", "Tutti has no oneCCL backend"},
      {"HOROVOD_CONTROLLER",
       "the launcher decides; TUTTI_CPU_OPERATIONS picks the CPU backend"},
      {"HOROVOD_DISABLE_GROUP_FUSION", "Tutti has no such switch"},
      {"HOROVOD_DISABLE_NVTX_RANGES", "Tutti emits no NVTX ranges"},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", "Tutti's process sets can always be added at run time"},
      {"HOROVOD_ELASTIC", "elastic jobs are started with tuttirun --min-np/--max-np"},
      {"HOROVOD_ENABLE_ASYNC_COMPLETION", "Tutti has no such switch"},
      {"HOROVOD_ENABLE_XLA_OPS", "Tutti has no XLA ops"},
      {"HOROVOD_GLOO_RENDEZVOUS_ADDR",
       "horovodrun's rendezvous: start the job with tuttirun, mpirun, srun or torchrun"},
      {"HOROVOD_GLOO_RENDEZVOUS_PORT",
       "horovodrun's rendezvous: start the job with tuttirun, mpirun, srun or torchrun"},
      {"HOROVOD_MPI_THREADS_DISABLE", "Tutti has no such switch"},
      {"HOROVOD_NUM_NCCL_STREAMS", "Tutti has no such switch"},
      {"HOROVOD_THREAD_AFFINITY", "pin processes with the launcher (mpirun --bind-to)"},
      {"HOROVOD_TORUS_ALLREDUCE",
       "Tutti has no torus allreduce; TUTTI_HIERARCHICAL_ALLREDUCE is its two-level one"},
  };
  return names;
}

std::vector<std::string> environmentWarnings(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (const auto& [name, value] : env) {
    if (value.empty()) continue;  // unset, as for the table
    if (name.rfind("HOROVOD_", 0) == 0) {
      for (const auto& unread : horovodWithoutTwin())
        if (name == unread.horovod)
          out.push_back(name + " is not read by Tutti (" + unread.instead + ")");
      continue;
    }
    std::string upper = name;
    for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper.rfind("TUTTI_", 0) != 0) continue;
    bool known = std::any_of(configTable().begin(), configTable().end(),
                             [&](const ConfigVar& v) { return name == v.name; });
    for (const char* launcher : kLauncherSet) known = known || name == launcher;
    if (known) continue;
    const std::string guess = meant(name);
    if (!guess.empty())
      out.push_back(name + " is not a Tutti variable and is ignored: did you mean " + guess + "?");
  }
  return out;
}

}  // namespace tutti
