// The job's rendezvous key-value server inside libtutti, for jobs that no tuttirun started
// (plain `srun`): rank 0 hosts it on a thread of its own for the life of its gloo transport.
//
// It speaks the protocol of RendezvousClient (backends/gloo/rendezvous_client.h; tuttirun's
// launcher/tuttirun_lib/rendezvous.py is the other server of it), with the same answers:
// a malformed, oversized, replayed or unauthenticated request gets an error response and the
// connection is closed. What an unauthenticated peer can take is bounded:
//  - a connection that has not yet sent an authenticated request must complete one within
//    `preauth_seconds` of being accepted, else it is closed;
//  - memory is taken as bytes arrive, not as a header claims; bytes held for requests not
//    yet authenticated are capped at `max_preauth_bytes` over all connections (a request
//    that would pass the cap is answered "server busy", and the client retries);
//  - at most `max_connections` connections; more are closed at once.
// Authenticated connections have `idle_seconds` between requests and `message_seconds` for
// each message they start to send or are sent; GET and WAIT wait at most their timeout_ms
// (capped at 24 hours). Every wait of the server thread is bounded by the nearest deadline.
//
// One thread (a poll loop) serves every connection. Thread-safe: set() may be called from
// any thread; the destructor stops the thread and closes every connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace tutti {
namespace detail {

struct RendezvousServerOptions {
  std::string bind_host;  // empty: every interface (IPv6 and IPv4 where the kernel allows)
  int port = 0;           // 0: one the kernel picks
  double message_seconds = 30.0;
  double idle_seconds = 3600.0;
  double preauth_seconds = 10.0;
  size_t max_connections = 4096;
  uint64_t max_preauth_bytes = 64ull << 20;
};

class RendezvousServer {
 public:
  // Binds and listens, then starts the thread. `secret` is the raw key (decoded), at least
  // 16 bytes. Throws Error(kInvalidArgument) for a short secret, Error(kBackend) naming the
  // address when it cannot bind.
  RendezvousServer(std::string secret, RendezvousServerOptions options);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }
  // Stores a value as a client's SET would (waiting GETs and WAITs see it).
  void set(const std::string& key, const std::string& value);
  // Requests refused so far (malformed, oversized, unauthenticated, busy).
  uint64_t rejected() const { return rejected_.load(); }
  size_t connections() const { return connections_.load(); }

 private:
  struct Connection;
  void loop();
  void acceptAll();
  void onReadable(Connection& c);
  void onRequest(Connection& c);
  bool tryAnswer(Connection& c);  // a parked GET/WAIT: answers when its keys are there
  void respond(Connection& c, uint8_t status, const std::string& payload);
  void refuse(Connection& c, uint8_t status, const std::string& message);
  void flush(Connection& c);
  void close(Connection& c);

  const std::string secret_;
  const RendezvousServerOptions options_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: set() and the destructor wake the loop
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<size_t> connections_{0};
  std::mutex store_mutex_;
  std::map<std::string, std::string> store_;
  bool store_changed_ = false;  // guarded by store_mutex_
  uint64_t preauth_bytes_ = 0;  // loop thread only
  bool stored_here_ = false;    // loop thread only: a client's SET or ADD this round
  std::map<int, std::unique_ptr<Connection>> conns_;  // loop thread only, by fd
  std::thread thread_;
};

}  // namespace detail
}  // namespace tutti
