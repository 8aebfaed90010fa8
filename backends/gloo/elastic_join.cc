#include "backends/gloo/elastic_join.h"

#include "backends/elastic.h"
#include "base/common.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace tutti {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr const char* kPublishedKey = "elastic/published";

std::atomic<int64_t> g_joined{-1};

// Generations published so far (the newest is this minus one); 0 before the first.
int64_t published(detail::RendezvousClient& store) { return store.add(kPublishedKey, 0); }

std::string seatKey(int64_t generation, const std::string& worker) {
  return "elastic/g" + std::to_string(generation) + "/seat/" + worker;
}

}  // namespace

bool elasticJob() {
  const char* worker = std::getenv("TUTTI_ELASTIC_WORKER");
  return worker != nullptr && *worker != '\0';
}

int64_t elasticJoinedGeneration() { return g_joined.load(); }

bool elasticHostsUpdated(const BackendOptions& options) {
  if (options.elastic.id.empty())
    throwError(StatusCode::kUnsupported,
               "hosts_updated: not an elastic job (start it with tuttirun --min-np/--max-np "
               "or --host-discovery-script; docs/elastic.md)");
  // One connection for the process's queries, made on the first.
  static std::mutex mu;
  static std::unique_ptr<detail::RendezvousClient> client;
  std::lock_guard<std::mutex> lock(mu);
  if (!client)
    client = std::make_unique<detail::RendezvousClient>(
        options.rendezvous_addr, options.rendezvous_port, detail::decodeHexSecret(options.secret),
        options.start_timeout_seconds, -1);
  return published(*client) - 1 > g_joined.load();
}

namespace detail {

ElasticSeat joinElasticGeneration(RendezvousClient& store, const ElasticWorker& worker) {
  const int64_t after = std::max(g_joined.load(), worker.first_generation - 1);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(
                            worker.timeout_seconds * 1000.0));
  int64_t newest = published(store) - 1;
  while (newest <= after) {  // bounded by the deadline
    if (std::chrono::steady_clock::now() >= deadline)
      throwError(StatusCode::kTimeout,
                 "elastic worker " + worker.id + ": the launcher published no generation after " +
                     std::to_string(after) + " within " + secondsText(worker.timeout_seconds) +
                     " s (TUTTI_ELASTIC_TIMEOUT, tuttirun --elastic-timeout)");
    std::this_thread::sleep_for(kPollInterval);
    newest = published(store) - 1;
  }
  const std::vector<char> raw = store.get(seatKey(newest, worker.id));
  const std::string text(raw.begin(), raw.end());
  ElasticSeat seat;
  seat.generation = newest;
  std::istringstream in(text);
  if (text == "none" || !(in >> seat.rank >> seat.size) || seat.size < 1 || seat.rank < 0 ||
      seat.rank >= seat.size)
    throwError(StatusCode::kAborted,
               "elastic worker " + worker.id + " has no place in generation " +
                   std::to_string(newest) + " (the launcher said '" + text +
                   "'; it stops this worker)");
  g_joined = newest;
  return seat;
}

}  // namespace detail
}  // namespace tutti
