#include "backends/gloo/elastic_join.h"

#include "backends/elastic.h"
#include "base/common.h"
#include "base/logging.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace tutti {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr auto kWatchInterval = std::chrono::seconds(1);
constexpr auto kStopGrace = std::chrono::seconds(3);  // tuttirun's own, SIGTERM to SIGKILL
constexpr const char* kPublishedKey = "elastic/published";

std::atomic<int64_t> g_joined{-1};
std::atomic<bool> g_launcher_gone{false};

// Generations published so far (the newest is this minus one); 0 before the first.
int64_t published(detail::RendezvousClient& store) { return store.add(kPublishedKey, 0); }

std::string seatKey(int64_t generation, const std::string& worker) {
  return "elastic/g" + std::to_string(generation) + "/seat/" + worker;
}

std::string joinedKey(const std::string& worker) { return "elastic/joined/" + worker; }

std::string goneMessage(const std::string& worker, const std::string& endpoint,
                        const std::string& why) {
  return "elastic worker " + worker + ": the launcher's rendezvous server at " + endpoint +
         " is gone (" + why + "): tuttirun ended without stopping this worker, so the job "
         "is over";
}

// Runs `call` on `store`; when it fails because the launcher's server has ended, marks the
// launcher gone (no failure is recoverable from then on) and says so.
template <typename Call>
auto askLauncher(detail::RendezvousClient& store, const std::string& worker, Call call)
    -> decltype(call()) {
  try {
    return call();
  } catch (const Error& e) {
    if (!store.serverGone()) throw;
    g_launcher_gone = true;
    throwError(StatusCode::kAborted, goneMessage(worker, store.endpoint(), "connection refused"));
  }
}

// The process's own connection to the launcher's server, for the commits' queries
// (elasticHostsUpdated) and the watch: made by the first that needs it.
std::shared_ptr<detail::RendezvousClient> launcherClient(
    const std::function<std::unique_ptr<detail::RendezvousClient>()>& make) {
  static std::mutex mu;
  static std::shared_ptr<detail::RendezvousClient> client;
  std::lock_guard<std::mutex> lock(mu);
  if (!client) {
    client = make();
    client->setServerListensFirst();  // tuttirun's server is up before any worker starts
  }
  return client;
}

// The worker's watch on its launcher: asks the server every kWatchInterval. When the server
// has ended (refused connections: tuttirun died without stopping this worker, say by
// SIGKILL) or has not answered for the elastic timeout, it logs why and stops the worker as
// tuttirun would have: SIGTERM to its process group (its own session, as tuttirun starts
// every worker; else to this process only), SIGKILL after kStopGrace. Started by the first
// init of the process; it outlives shutdown and init, and is stopped at exit.
class LauncherWatch {
 public:
  LauncherWatch(std::shared_ptr<detail::RendezvousClient> client, std::string worker,
                double silent_seconds)
      : client_(std::move(client)),
        worker_(std::move(worker)),
        silent_(std::chrono::milliseconds(static_cast<int64_t>(silent_seconds * 1000.0))),
        owner_(::getpid()),
        thread_([this] { loop(); }) {}

  ~LauncherWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    // A forked child holds a copy of this object but not the thread.
    if (::getpid() == owner_) thread_.join();
    else thread_.detach();
  }

 private:
  // Waits `span` or until the watch is stopped; true when stopped.
  bool pause(std::chrono::milliseconds span) {
    std::unique_lock<std::mutex> lock(mutex_);
    return wake_.wait_for(lock, span, [this] { return stop_; });
  }

  void loop() {
    auto answered = SteadyClock::now();
    std::string why;
    for (;;) {  // until stopped or the launcher is gone
      if (pause(kWatchInterval)) return;
      try {
        published(*client_);
        answered = SteadyClock::now();
        continue;
      } catch (const std::exception& e) {  // a thread of its own: nothing escapes it
        if (client_->serverGone()) {
          why = "connection refused";
        } else if (SteadyClock::now() - answered >= silent_) {
          why = "no answer for " + secondsText(std::chrono::duration<double>(
                                                   SteadyClock::now() - answered).count()) +
                " s, the last error: " + e.what();
        } else {
          continue;
        }
      }
      break;
    }
    g_launcher_gone = true;
    const bool own_session = ::getpgrp() == ::getsid(0);
    TUTTI_LOG(kError) << goneMessage(worker_, client_->endpoint(), why) << "; stopping "
                      << (own_session ? "its process group" : "it")
                      << " (SIGTERM, then SIGKILL after "
                      << std::chrono::duration_cast<std::chrono::seconds>(kStopGrace).count()
                      << " s)";
    const auto send = [own_session](int sig) {
      if (own_session) ::kill(-::getpgrp(), sig);
      else ::kill(::getpid(), sig);
    };
    send(SIGTERM);
    if (pause(kStopGrace)) return;  // exiting
    send(SIGKILL);
  }

  const std::shared_ptr<detail::RendezvousClient> client_;
  const std::string worker_;
  const std::chrono::milliseconds silent_;
  const pid_t owner_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is made
};

void watchLauncher(detail::RendezvousClient& store, const ElasticWorker& worker) {
  static std::once_flag once;
  static std::unique_ptr<LauncherWatch> watch;
  std::call_once(once, [&] {
    watch = std::make_unique<LauncherWatch>(launcherClient([&] { return store.another(); }),
                                            worker.id, worker.timeout_seconds);
  });
}

}  // namespace

bool elasticJob() {
  const char* worker = std::getenv("TUTTI_ELASTIC_WORKER");
  return worker != nullptr && *worker != '\0';
}

int64_t elasticJoinedGeneration() { return g_joined.load(); }

bool elasticLauncherGone() { return g_launcher_gone.load(); }

bool elasticHostsUpdated(const BackendOptions& options) {
  if (options.elastic.id.empty())
    throwError(StatusCode::kUnsupported,
               "hosts_updated: not an elastic job (start it with tuttirun --min-np/--max-np "
               "or --host-discovery-script; docs/elastic.md)");
  const auto client = launcherClient([&] {
    return std::make_unique<detail::RendezvousClient>(
        options.rendezvous_addr, options.rendezvous_port, detail::decodeHexSecret(options.secret),
        options.start_timeout_seconds, -1);
  });
  return askLauncher(*client, options.elastic.id, [&] { return published(*client); }) - 1 >
         g_joined.load();
}

namespace detail {

ElasticSeat joinElasticGeneration(RendezvousClient& store, const ElasticWorker& worker) {
  store.setServerListensFirst();  // tuttirun's server is up before any worker starts
  const auto ask = [&](auto call) { return askLauncher(store, worker.id, call); };
  watchLauncher(store, worker);
  const int64_t after = std::max(g_joined.load(), worker.first_generation - 1);
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                                 worker.timeout_seconds * 1000.0));
  int64_t newest = ask([&] { return published(store); }) - 1;
  while (newest <= after) {  // bounded by the deadline
    if (SteadyClock::now() >= deadline)
      throwError(StatusCode::kTimeout,
                 "elastic worker " + worker.id + ": the launcher published no generation after " +
                     std::to_string(after) + " within " + secondsText(worker.timeout_seconds) +
                     " s (TUTTI_ELASTIC_TIMEOUT, tuttirun --elastic-timeout)");
    std::this_thread::sleep_for(kPollInterval);
    newest = ask([&] { return published(store); }) - 1;
  }
  const std::vector<char> raw = ask([&] { return store.get(seatKey(newest, worker.id)); });
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
  // The launcher reads it when a worker exits 0: the job is done in that generation.
  const std::string joined = std::to_string(newest);
  ask([&] {
    store.set(joinedKey(worker.id), std::vector<char>(joined.begin(), joined.end()));
    return 0;
  });
  g_joined = newest;
  return seat;
}

}  // namespace detail
}  // namespace tutti
