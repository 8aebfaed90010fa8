// Client of tuttirun's rendezvous key-value server, as a gloo::rendezvous::Store.
//
// Wire protocol, version 2 (all integers little-endian; the server is
// launcher/tuttirun_lib/rendezvous.py, whose comment has the server's limits, or under plain
// srun backends/gloo/rendezvous_server.h, with the same limits; rendezvous_wire.h has the
// codes and frames both C++ sides use):
//  1. On accept the server sends a hello: "TUTH", version byte (2), 16-byte random nonce.
//  2. The client proves it holds the secret before anything else: "TUTC" and
//     HMAC-SHA256(secret, "tutti-rdzv-auth" | nonce), 36 bytes. The server drops a connection
//     that has not done so within 2 s, and the oldest such connection when too many wait, so
//     idle or junk connections of others cannot hold it.
//  3. The server answers with a response of seq 0 (below): OK; UNAUTHENTICATED (wrong secret:
//     fatal); or BUSY when every connection slot is taken. BUSY, and a connection closed
//     before the answer, are retried with backoff (50 ms doubling to 1 s, jittered) until
//     the start deadline (TUTTI_START_TIMEOUT_SECONDS).
//  4. A request is a 32-byte header "TUTQ", op, 3 zero bytes, u64 seq, u32 timeout_ms,
//     u32 key_len, u64 value_len; then the key, the value, and a 32-byte
//     HMAC-SHA256(secret, "tutti-rdzv-req" | nonce | header | key | value).
//     seq starts at 1 and grows by one per request on a connection, so a captured request
//     is useless on another connection (other nonce) or replayed on the same one.
//  5. A response is a 24-byte header "TUTA", status, 3 zero bytes, u64 seq, u64 payload_len;
//     the payload and HMAC-SHA256(secret, "tutti-rdzv-resp" | nonce | header | payload).
//  Ops: SET key=value; GET key (waits up to timeout_ms for it); WAIT (value = u32-length-
//  prefixed keys; waits for all); ADD key (value = i64 delta; returns the new i64).
//  A malformed, oversized or unauthenticated request gets an error response and the server
//  closes the connection; a request answered BUSY (too many bytes in flight) is sent again
//  on a new connection, with backoff, until the start deadline.
//
// Thread-safe (one request at a time on one connection, reconnecting when the server has
// closed it). Every call has a deadline: timeouts throw Error(kTimeout) naming the key.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

constexpr size_t kRendezvousMaxKey = 4096;
constexpr uint64_t kRendezvousMaxValue = 64ull << 20;

// Decodes a hex string (TUTTI_SECRET); throws Error(kInvalidArgument) when it is not hex.
std::string decodeHexSecret(const std::string& hex);

class RendezvousClient : public gloo::rendezvous::Store {
 public:
  // `secret` is the raw key (decoded); `rank` only labels error messages.
  RendezvousClient(std::string host, int port, std::string secret, double timeout_seconds,
                   int rank);
  ~RendezvousClient() override;
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  int64_t add(const std::string& key, int64_t delta);

  std::string endpoint() const;  // "host:port"

  // For a server that listens before any of its clients starts (tuttirun's): a refused
  // connection then means that it has ended, and throws Error(kAborted) at once (and
  // serverGone() turns true) instead of being retried until the start deadline.
  void setServerListensFirst();
  bool serverGone() const;
  // Another client of the same server (its own connection), with the same secret, deadline,
  // rank and mode.
  std::unique_ptr<RendezvousClient> another() const;

 private:
  enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4 };
  std::string request(Op op, const std::string& key, const std::string& value,
                      std::chrono::milliseconds wait, const std::string& what);
  struct Reply {
    uint8_t status = 0;
    std::string payload;
  };
  // Connects and authenticates, retrying refused connections (unless the server listens
  // first), BUSY answers and dropped handshakes with backoff until `deadline`.
  void connectLocked(std::chrono::steady_clock::time_point deadline);
  // One attempt; false (with `why`) for what a retry may cure, throws for the rest.
  bool tryConnectLocked(std::chrono::steady_clock::time_point deadline, std::string& why);
  bool readExactLocked(std::string& out, size_t bytes,
                       std::chrono::steady_clock::time_point deadline, std::string& why);
  bool sendLocked(const std::string& bytes, std::chrono::steady_clock::time_point deadline,
                  std::string& why);
  // Reads one response and checks its HMAC and seq; false (with `why`) when the connection
  // closed or the deadline passed first.
  bool readReplyLocked(std::chrono::steady_clock::time_point deadline, Reply& reply,
                       std::string& why);
  void closeLocked();

  const std::string host_;
  const int port_;
  const std::string secret_;
  const std::chrono::milliseconds timeout_;
  const int rank_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string nonce_;
  uint64_t seq_ = 0;
  std::atomic<bool> listens_first_{false};
  std::atomic<bool> gone_{false};
};

}  // namespace detail
}  // namespace tutti
