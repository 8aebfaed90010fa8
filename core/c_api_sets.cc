// The C API (tutti.h) of process sets, the timeline and the counters (docs/c_api.md).
#include "core/api.h"
#include "core/c_api_util.h"

#include <tutti/tutti.h>

#include <string>
#include <utility>
#include <vector>

using tutti::capi::guarded;
using tutti::capi::invalid;

extern "C" {

tutti_status_t tutti_add_process_set(const int* ranks, int nranks, int* process_set) {
  if (ranks == nullptr || nranks <= 0) return invalid("add_process_set: expected a non-empty rank list");
  return guarded([&] { return tutti::api::addProcessSet(std::vector<int>(ranks, ranks + nranks), process_set); });
}

tutti_status_t tutti_remove_process_set(int process_set) {
  return guarded([&] { return tutti::api::removeProcessSet(process_set); });
}

int tutti_process_set_rank(int process_set) { return tutti::api::processSetRank(process_set); }
int tutti_process_set_size(int process_set) { return tutti::api::processSetSize(process_set); }

tutti_status_t tutti_process_set_ranks(int process_set, int* ranks, int capacity, int* nranks) {
  if (nranks == nullptr) return invalid("process_set_ranks: nranks is null");
  if (capacity < 0 || (ranks == nullptr && capacity > 0))
    return invalid("process_set_ranks: capacity is " + std::to_string(capacity) +
                   (ranks ? "" : " with ranks NULL") + ", expected >= 0 (0 when ranks is NULL)");
  return guarded([&] {
    if (!tutti::api::isInitialized())
      return tutti::Status(tutti::StatusCode::kNotInitialized, "process_set_ranks: Tutti is not initialized: call tutti_init() first");
    const std::vector<int> all = tutti::api::processSetRanks(process_set);
    if (all.empty())
      return tutti::Status(tutti::StatusCode::kInvalidArgument,
                           "process_set_ranks: process set " + std::to_string(process_set) + " does not exist");
    *nranks = static_cast<int>(all.size());
    for (int i = 0; i < capacity && i < *nranks; ++i) ranks[i] = all[static_cast<size_t>(i)];
    return tutti::Status::OK();
  });
}

tutti_status_t tutti_start_timeline(const char* path, int mark_cycles) {
  if (path == nullptr) return invalid("start_timeline: path is null");
  return guarded([&] { return tutti::api::startTimeline(path, mark_cycles != 0); });
}

tutti_status_t tutti_stop_timeline(void) {
  return guarded([] { return tutti::api::stopTimeline(); });
}

tutti_status_t tutti_stats(const tutti_stat_t** stats, int* count) {
  if (stats == nullptr || count == nullptr) return invalid("tutti_stats: null pointer");
  // The names and values stay valid on this thread until its next call.
  static thread_local std::vector<std::pair<std::string, int64_t>> t_values;
  static thread_local std::vector<tutti_stat_t> t_stats;
  return guarded([&] {
    if (!tutti::api::isInitialized()) return tutti::Status(tutti::StatusCode::kNotInitialized, "tutti_stats: Tutti is not initialized: call tutti_init() first");
    t_values = tutti::api::stats();
    t_stats.clear();
    for (const auto& kv : t_values) t_stats.push_back(tutti_stat_t{kv.first.c_str(), kv.second});
    *stats = t_stats.data();
    *count = static_cast<int>(t_stats.size());
    return tutti::Status::OK();
  });
}

tutti_status_t tutti_stat(const char* name, int64_t* value) {
  if (name == nullptr || value == nullptr) return invalid("tutti_stat: null pointer");
  return guarded([&] {
    if (!tutti::api::isInitialized()) return tutti::Status(tutti::StatusCode::kNotInitialized, "tutti_stat: Tutti is not initialized: call tutti_init() first");
    for (const auto& kv : tutti::api::stats())
      if (kv.first == name) {
        *value = kv.second;
        return tutti::Status::OK();
      }
    return tutti::Status(tutti::StatusCode::kInvalidArgument,
                         std::string("tutti_stat: no counter named '") + name +
                             "' (per-op counters appear once such an op ran; tutti_stats lists them)");
  });
}

}  // extern "C"
