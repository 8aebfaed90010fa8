// The job's rendezvous key-value server inside libtutti, for jobs that no tuttirun started
// (plain `srun`): rank 0 hosts it on a thread of its own for the life of its gloo transport.
//
// It speaks protocol version 2 of RendezvousClient (backends/gloo/rendezvous_client.h;
// tuttirun's launcher/tuttirun_lib/rendezvous.py is the reference server), with the same
// answers and limits. Before a connection proves the job secret it costs one descriptor and
// a 36-byte buffer, nothing else:
//  - it must send its proof ("TUTC" + HMAC of the nonce) within `auth_seconds` (2 s) of its
//    accept, else it is closed; when `max_pending` (1024) such connections wait, the oldest
//    is closed to make room for a new one;
//  - a wrong proof is answered UNAUTHENTICATED, and the connection closed.
// A good proof is answered with a response of seq 0: OK, or BUSY (then closed; the client
// retries) when `max_connections` (4096) authenticated connections are open. Requests are
// then read header first: a malformed, oversized, replayed or unauthenticated one gets an
// error response and the connection is closed; one whose key, value and MAC would take the
// bytes in flight over all connections past `max_inflight_bytes` (256 MiB) is answered
// BUSY (the client sends it again on a new connection). Authenticated connections have
// `idle_seconds` between requests and `message_seconds` for each message they start to send
// or are sent; GET and WAIT wait at most their timeout_ms (capped at 24 hours). Every wait of
// the server thread is bounded by the nearest deadline.
//
// One thread (a poll loop) serves every connection. Thread-safe: set() and the counters may
// be used from any thread; the destructor stops the thread and closes every connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
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
  double auth_seconds = 2.0;      // to prove the secret after the accept
  size_t max_pending = 1024;      // connections that have not proved it yet
  size_t max_connections = 4096;  // authenticated connections
  uint64_t max_inflight_bytes = 256ull << 20;
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
  // Proofs and requests refused so far (malformed, oversized, unauthenticated).
  uint64_t rejected() const { return rejected_.load(); }
  // Connections closed before proving the secret (late, evicted, or closed by the peer).
  uint64_t dropped() const { return dropped_.load(); }
  // Connections and requests answered BUSY.
  uint64_t busy() const { return busy_.load(); }
  // Open connections that have proved the secret / not yet (as of the loop's last round).
  size_t connections() const { return connections_.load(); }
  size_t pending() const { return pending_count_.load(); }

 private:
  struct Connection;
  void loop();
  void acceptAll();
  void onReadable(Connection& c);
  void onProof(Connection& c);
  void onRequest(Connection& c);
  bool tryAnswer(Connection& c);  // a parked GET/WAIT: answers when its keys are there
  void respond(Connection& c, uint8_t status, const std::string& payload);
  void refuse(Connection& c, uint8_t status, const std::string& message);
  void flush(Connection& c);
  void close(Connection& c);  // a connection that has not proved the secret counts as dropped

  const std::string secret_;
  const RendezvousServerOptions options_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: set() and the destructor wake the loop
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> busy_{0};
  std::atomic<size_t> connections_{0};
  std::atomic<size_t> pending_count_{0};
  std::mutex store_mutex_;
  std::map<std::string, std::string> store_;
  bool store_changed_ = false;  // guarded by store_mutex_
  uint64_t inflight_bytes_ = 0;  // loop thread only: reserved by requests being read
  size_t authenticated_ = 0;     // loop thread only: open connections that proved the secret
  std::list<Connection*> pending_;  // loop thread only: not proved yet, oldest first
  std::chrono::steady_clock::time_point accept_paused_until_;  // loop thread: out of fds
  bool stored_here_ = false;    // loop thread only: a client's SET or ADD this round
  std::map<int, std::unique_ptr<Connection>> conns_;  // loop thread only, by fd
  std::thread thread_;
};

}  // namespace detail
}  // namespace tutti
