// gloo transport.
//  1. Connect to tuttirun's rendezvous server (RendezvousClient, HMAC-authenticated); under
//     plain srun, torchrun and hydra rank 0 hosts the server itself
//     (backends/gloo/slurm_rendezvous.h); a program that started Tutti from a store of its
//     own (tutti_init_with_store) connects through that store instead (CallerStore).
//  2. Open one gloo TCP device on TUTTI_GLOO_IFACE, or else on the local address that
//     routes to the rendezvous server (127.0.0.1 for a single-host job).
//  3. Per process set and plane ("control" / "data"): a gloo::rendezvous::Context over a
//     PrefixStore "tutti/t<t>/ps<id>/<plane>/<n>", connected as a full mesh. t counts the
//     transports this process has made (init after shutdown makes a new one; init is
//     collective, so t is the same on every rank) and n how often this transport connected
//     that set and plane (the same on every member): stale addresses are never read.
//     In an elastic job the generation's number takes t's place ("tutti/e<g>/..."): its
//     workers joined it after different numbers of transports (backends/elastic.h).
//  4. A timeout, a dead peer or abort() in any group poisons every group of the transport.
#include "backends/gloo/gloo_transport.h"

#include "backends/gloo/elastic_join.h"
#include "backends/gloo/gloo_backend.h"
#include "backends/gloo/gloo_group.h"
#include "backends/gloo/rendezvous_client.h"
#include "backends/gloo/slurm_rendezvous.h"
#include "base/process_state.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tutti {
namespace {

// A short key for a list of members ("0, 2, 3"): 16 hex digits of its FNV-1a hash, so that
// keys stay short for sets of many ranks.
std::string membersKey(const std::string& members) {
  const uint64_t h = fnv1a(members.data(), members.size());
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// The local IP address the kernel would use to reach `host` (no packet is sent).
std::string localAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) != 0 || !list)
    throwError(StatusCode::kInvalidArgument,
               "gloo: cannot resolve the rendezvous host '" + host +
                   "' (TUTTI_RENDEZVOUS_ADDR, or under srun the first node of the step)");
  std::string result;
  for (addrinfo* ai = list; ai && result.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(
                                   &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(
                                   &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text))) result = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(list);
  if (result.empty())
    throwError(StatusCode::kBackend, "gloo: no local address routes to the rendezvous "
                                     "server at " + host + "; set TUTTI_GLOO_IFACE");
  return result;
}

std::atomic<int> transports_made{0};

// The program's store (BackendOptions::store) as gloo's. Its gets wait up to the start
// deadline; a key that does not come is Error(kTimeout) naming it.
class CallerStore : public gloo::rendezvous::Store {
 public:
  CallerStore(std::shared_ptr<KeyValueStore> store, double timeout_seconds)
      : store_(std::move(store)),
        timeout_(static_cast<int64_t>(std::max(0.001, timeout_seconds) * 1000.0)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& key : keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      store_->get(key, std::max(left, std::chrono::milliseconds(1)));
    }
  }

 private:
  std::shared_ptr<KeyValueStore> store_;
  const std::chrono::milliseconds timeout_;
};

// gloo writes to its TCP pairs without MSG_NOSIGNAL: a peer that died would kill this
// process with SIGPIPE instead of letting the write fail into an error naming the peer.
// Ignored only if the program left it at the default.
void ignoreSigpipe() {
  struct sigaction current;
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
}

class GlooTransport : public Transport {
 public:
  explicit GlooTransport(const BackendOptions& options)
      : options_(options),
        rank_(options.rank),
        size_(options.size),
        generation_(transports_made++),
        tag_("t" + std::to_string(generation_)) {
    ignoreSigpipe();
    if (rank_ < 0 || rank_ >= size_)
      throwError(StatusCode::kInvalidArgument, "gloo: rank " + std::to_string(rank_) +
                                                   " outside a world of " +
                                                   std::to_string(size_));
    std::string host = options.rendezvous_addr;
    int port = options.rendezvous_port;
    if (options.store) {
      store_ = std::make_unique<CallerStore>(options.store, options.start_timeout_seconds);
      endpoint_ = options.store->describe();
      // The device listens on TUTTI_GLOO_IFACE, else on the address that routes to
      // TUTTI_RENDEZVOUS_ADDR (a host of the job), else on loopback (a job on one host).
      if (host.empty()) host = "127.0.0.1";
      if (port <= 0) port = 1;
    } else if (options.launcher == "Slurm" || !options.hosted.launcher.empty()) {
      auto served = options.launcher == "Slurm"
                        ? detail::connectSlurmRendezvous(options, generation_)
                        : detail::connectHostedRendezvous(options, generation_);
      server_ = std::move(served.server);
      endpoint_ = served.client->endpoint();
      store_ = std::move(served.client);
      host = served.host;
      port = served.port;
    } else {
      if (host.empty() || port <= 0)
        throwError(StatusCode::kInvalidArgument,
                   "TUTTI_CPU_OPERATIONS=gloo needs TUTTI_RENDEZVOUS_ADDR and "
                   "TUTTI_RENDEZVOUS_PORT (start the job with tuttirun, or with srun)");
      auto client = std::make_unique<detail::RendezvousClient>(
          host, port, detail::decodeHexSecret(options.secret), options.start_timeout_seconds,
          rank_);
      endpoint_ = client->endpoint();
      if (!options.elastic.id.empty()) {
        const auto seat = detail::joinElasticGeneration(*client, options.elastic);
        rank_ = seat.rank;
        size_ = seat.size;
        tag_ = "e" + std::to_string(seat.generation);
      }
      store_ = std::move(client);
    }
    publishProcess();
    gloo::transport::tcp::attr attr;
    if (!options.gloo_iface.empty()) {
      attr.iface = options.gloo_iface;
    } else {
      attr.hostname = localAddressToward(host, port);
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throwError(StatusCode::kBackend,
                 "gloo: rank " + std::to_string(rank_) + " cannot open a TCP device on " +
                     (attr.iface.empty() ? "address " + attr.hostname
                                         : "interface " + attr.iface) +
                     ": " + e.what());
    }
  }

  ~GlooTransport() override { poison_->setStoppedPeersProbe(nullptr); }

  const char* name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks,
                                                 int id) override {
    return detail::makeGlooControlPlane(connect(ranks, id, "control"));
  }

  std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) override {
    return detail::makeGlooBackend(connect(ranks, id, "data"));
  }

 private:
  // Records this process (host, pid) in the store, so that a timeout on any rank can
  // name the ranks on its host that are stopped; the others' records are read only then,
  // once (a timeout is fatal), within a second.
  void publishProcess() {
    const std::string key = "tutti/" + tag_ + "/process/";
    const std::string me = describeThisProcess();
    store_->set(key + std::to_string(rank_), std::vector<char>(me.begin(), me.end()));
    // The program's store is read now, while the program waits in init, so that a timeout
    // later never calls into the program from Tutti's background thread.
    if (options_.store)
      readPeers(key, std::chrono::milliseconds(static_cast<int64_t>(
                         std::max(0.001, options_.start_timeout_seconds) * 1000.0)));
    poison_->setStoppedPeersProbe([this, key] {
      if (peers_.empty()) readPeers(key, std::chrono::milliseconds(1000));
      return describeStoppedPeers(peers_, rank_);
    });
  }

  void readPeers(const std::string& key, std::chrono::milliseconds timeout) {
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(key + std::to_string(r));
    store_->wait(keys, timeout);
    for (const auto& k : keys) {
      const auto value = store_->get(k);
      peers_.push_back(parsePeerProcess(std::string(value.begin(), value.end())));
    }
  }

  std::unique_ptr<detail::GlooGroup> connect(const std::vector<int>& ranks, int id,
                                             const std::string& plane) {
    const std::string wrong = checkGroupRanks(ranks, size_, rank_);
    if (!wrong.empty())
      throwError(StatusCode::kInvalidArgument, "rank " + std::to_string(rank_) +
                                                   ": gloo group " + std::to_string(id) + ": " +
                                                   wrong);
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    const int group_rank = static_cast<int>(me - ranks.begin());
    const int group_size = static_cast<int>(ranks.size());
    // The keys of this connection: a removed set's id is given to the next set, whose
    // members may be others, so the key names the members too, and counts the connections
    // of the same set id, plane and members (every member makes each of them alike).
    const std::string members = joinInts(ranks);
    const int epoch = epochs_[{id, plane + "/" + members}]++;
    const std::string prefix = "tutti/" + tag_ + "/ps" + std::to_string(id) + "/" + plane +
                               "/" + membersKey(members) + "/" + std::to_string(epoch);
    auto context = std::make_shared<gloo::rendezvous::Context>(group_rank, group_size);
    const auto timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.001, options_.start_timeout_seconds) * 1000.0));
    context->setTimeout(timeout);
    const std::string what = "gloo: world rank " + std::to_string(rank_) +
                             " connecting the " + plane + " plane of process set " +
                             std::to_string(id) + " (world ranks " + joinInts(ranks) +
                             ") through " + endpoint_;
    try {
      gloo::rendezvous::PrefixStore store(prefix, *store_);
      context->connectFullMesh(store, device_);
    } catch (const Error& e) {
      throwError(e.code(), what + ": " + e.what());
    } catch (const gloo::Exception& e) {
      const bool timed_out = std::strstr(e.what(), "imed out") != nullptr;
      throwError(timed_out ? StatusCode::kTimeout : StatusCode::kBackend,
                 what + (timed_out ? " timed out after " : " failed within ") +
                     secondsText(options_.start_timeout_seconds) +
                     " s (TUTTI_START_TIMEOUT_SECONDS): " + e.what());
    } catch (const std::exception& e) {
      throwError(StatusCode::kBackend, what + " failed: " + e.what());
    }
    return std::make_unique<detail::GlooGroup>(std::move(context), ranks, id, plane, poison_);
  }

  const BackendOptions options_;
  int rank_, size_;         // an elastic worker's from its seat (set once, in the constructor)
  const int generation_;    // transports this process made before this one
  std::string tag_;         // of its keys: "t<generation_>" or "e<elastic generation>"
  std::unique_ptr<detail::RendezvousServer> server_;  // rank 0 under srun; outlives store_
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::string endpoint_;    // where store_ is, for messages
  std::shared_ptr<gloo::transport::Device> device_;
  std::map<std::pair<int, std::string>, int> epochs_;  // (set id, plane/members) -> count
  std::vector<PeerProcess> peers_;  // every world rank's process, read at the first timeout
  // The first failure of any group poisons every group of this transport.
  std::shared_ptr<detail::GlooPoison> poison_ = std::make_shared<detail::GlooPoison>();
};

}  // namespace

std::unique_ptr<Transport> makeGlooTransport(const BackendOptions& options) {
  return std::make_unique<GlooTransport>(options);
}

}  // namespace tutti
