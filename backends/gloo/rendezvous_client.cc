#include "backends/gloo/rendezvous_client.h"

#include "backends/gloo/rendezvous_wire.h"
#include "base/common.h"

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tutti {
namespace detail {
namespace {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

constexpr auto kReplySlack = std::chrono::seconds(10);
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);

int msLeft(TimePoint deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on fd until `deadline`; false on timeout.
bool pollFor(int fd, short events, TimePoint deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, msLeft(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sleeps 50-100% of `backoff` (jitter, so that many ranks do not retry in step), doubles it.
void sleepBackoff(std::chrono::milliseconds& backoff) {
  thread_local std::minstd_rand jitter(std::random_device{}());
  std::this_thread::sleep_for(backoff / 2 + std::chrono::milliseconds(jitter() %
                                                                      (backoff.count() / 2 + 1)));
  backoff = std::min(backoff * 2, std::chrono::milliseconds(kMaxBackoff));
}

}  // namespace

std::string decodeHexSecret(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throwError(StatusCode::kInvalidArgument,
               "TUTTI_SECRET: expected a hex string (as tuttirun generates), got a non-hex "
               "character");
  };
  if (hex.empty() || hex.size() % 2 != 0)
    throwError(StatusCode::kInvalidArgument,
               "TUTTI_SECRET: expected a non-empty hex string of even length, got " +
                   std::to_string(hex.size()) + " characters");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2)
    out.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  return out;
}

RendezvousClient::RendezvousClient(std::string host, int port, std::string secret,
                                   double timeout_seconds, int rank)
    : host_(std::move(host)),
      port_(port),
      secret_(std::move(secret)),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0))),
      rank_(rank) {
  if (host_.empty() || port_ <= 0 || port_ > 65535)
    throwError(StatusCode::kInvalidArgument,
               "gloo rendezvous: TUTTI_RENDEZVOUS_ADDR/TUTTI_RENDEZVOUS_PORT must name the "
               "server tuttirun started, got '" + host_ + ":" + std::to_string(port_) + "'");
  if (secret_.empty())
    throwError(StatusCode::kInvalidArgument,
               "gloo rendezvous: no job secret (TUTTI_SECRET or TUTTI_SECRET_FILE); start the "
               "job with tuttirun");
}

RendezvousClient::~RendezvousClient() { closeLocked(); }

std::string RendezvousClient::endpoint() const { return host_ + ":" + std::to_string(port_); }

void RendezvousClient::setServerListensFirst() { listens_first_ = true; }

bool RendezvousClient::serverGone() const { return gone_.load(); }

std::unique_ptr<RendezvousClient> RendezvousClient::another() const {
  auto client = std::make_unique<RendezvousClient>(
      host_, port_, secret_, static_cast<double>(timeout_.count()) / 1000.0, rank_);
  if (listens_first_) client->setServerListensFirst();
  return client;
}

void RendezvousClient::closeLocked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  nonce_.clear();
  seq_ = 0;
}

bool RendezvousClient::tryConnectLocked(TimePoint deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &list);
  if (rc != 0) {
    why = std::string("getaddrinfo: ") + gai_strerror(rc);
    return false;
  }
  bool refused = list != nullptr;  // by every address
  for (addrinfo* ai = list; ai && fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      refused = false;
      continue;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    int crc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (crc != 0 && errno == EINPROGRESS) {
      if (pollFor(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        crc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (crc == 0) {
      fd_ = fd;
    } else {
      refused = refused && errno == ECONNREFUSED;
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (fd_ < 0 && refused && listens_first_) {
    gone_ = true;
    throwError(StatusCode::kAborted,
               "gloo rendezvous: rank " + std::to_string(rank_) + ": the server at " +
                   endpoint() + " refused the connection: it has ended (it listens before "
                   "any of its clients starts)");
  }
  if (fd_ < 0) return false;

  // Steps 1-3: hello, proof of the secret, the server's answer.
  std::string hello;
  if (!readExactLocked(hello, kRendezvousHelloBytes, deadline, why)) {
    why = "no hello: " + why;
    return false;  // dropped while the server was flooded, say: retry
  }
  if (hello.compare(0, 4, "TUTH") != 0 || hello[4] != kRendezvousVersion) {
    closeLocked();
    throwError(StatusCode::kBackend,
               "gloo rendezvous: rank " + std::to_string(rank_) + ": " + endpoint() +
                   " did not answer with a tuttirun rendezvous hello of protocol version " +
                   std::to_string(kRendezvousVersion) + " (is it this job's tuttirun, of this version?)");
  }
  nonce_ = hello.substr(5, kRendezvousNonceBytes);
  seq_ = 0;
  if (!sendLocked(rendezvousProof(secret_, nonce_), deadline, why))
    return false;
  Reply reply;
  if (!readReplyLocked(deadline, reply, why)) {
    why = "no answer to the proof of the secret: " + why;
    return false;
  }
  if (reply.status == kRdzvOk) return true;
  if (reply.status == kRdzvBusy) {
    why = "server busy: " + reply.payload;
    return false;
  }
  closeLocked();
  throwError(StatusCode::kBackend,
             "gloo rendezvous: rank " + std::to_string(rank_) + ": the server at " + endpoint() +
                 " refused this rank's proof of the job secret (HMAC): " + reply.payload +
                 " (does TUTTI_SECRET match the job's secret?)");
}

void RendezvousClient::connectLocked(TimePoint deadline) {
  auto backoff = kFirstBackoff;
  std::string why = "no attempt";
  for (int attempt = 1;; ++attempt) {
    if (tryConnectLocked(deadline, why)) return;
    closeLocked();
    if (SteadyClock::now() + backoff >= deadline)
      throwError(StatusCode::kTimeout,
                 "gloo rendezvous: rank " + std::to_string(rank_) +
                     " could not connect to the tuttirun server at " + endpoint() +
                     " before its deadline (TUTTI_START_TIMEOUT_SECONDS), " +
                     std::to_string(attempt) + " attempt(s), the last: " + why);
    sleepBackoff(backoff);
  }
}

bool RendezvousClient::readExactLocked(std::string& out, size_t bytes, TimePoint deadline,
                                       std::string& why) {
  out.resize(bytes);
  for (size_t got = 0; got < bytes;) {
    if (!pollFor(fd_, POLLIN, deadline)) {
      why = "no reply before the deadline";
      return false;
    }
    ssize_t n = ::recv(fd_, &out[got], bytes - got, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      why = n == 0 ? "the server closed the connection" : std::strerror(errno);
      return false;
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

bool RendezvousClient::sendLocked(const std::string& bytes, TimePoint deadline,
                                  std::string& why) {
  for (size_t sent = 0; sent < bytes.size();) {
    if (!pollFor(fd_, POLLOUT, deadline)) {
      why = "send timed out";
      return false;
    }
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      why = std::string("send failed: ") + std::strerror(errno);
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RendezvousClient::readReplyLocked(TimePoint deadline, Reply& reply, std::string& why) {
  std::string header, mac;
  if (!readExactLocked(header, kRendezvousResponseHeaderBytes, deadline, why)) return false;
  if (header.compare(0, 4, "TUTA") != 0) {
    why = "malformed reply";
    return false;
  }
  reply.status = static_cast<uint8_t>(header[4]);
  const uint64_t seq = getLittleEndian(&header[8], 8);
  const uint64_t length = getLittleEndian(&header[16], 8);
  if (length > kRendezvousMaxValue + 4096) {
    why = "oversized reply";
    return false;
  }
  if (!readExactLocked(reply.payload, static_cast<size_t>(length), deadline, why) ||
      !readExactLocked(mac, kRendezvousMacBytes, deadline, why))
    return false;
  // Signed with the job's secret, which a rank refused as unauthenticated may not hold.
  if (reply.status == kRdzvUnauthenticated) return true;
  const std::string expect =
      hmacSha256(secret_, "tutti-rdzv-resp" + nonce_ + header + reply.payload);
  if (!macEqual(expect, mac) || seq != seq_)
    throwError(StatusCode::kBackend,
               "gloo rendezvous: rank " + std::to_string(rank_) + ": a reply from " +
                   endpoint() + " failed authentication (wrong secret or not tuttirun)");
  return true;
}

std::string RendezvousClient::request(Op op, const std::string& key, const std::string& value,
                                      std::chrono::milliseconds wait, const std::string& what) {
  if (key.size() > kRendezvousMaxKey || value.size() > kRendezvousMaxValue)
    throwError(StatusCode::kInvalidArgument,
               "gloo rendezvous: " + what + ": key of " + std::to_string(key.size()) +
                   " bytes or value of " + std::to_string(value.size()) +
                   " bytes exceeds the limit (4096 / 64 MiB)");
  static_assert(int(kSet) == kRdzvSet && int(kGet) == kRdzvGet && int(kWait) == kRdzvWait &&
                    int(kAdd) == kRdzvAdd,
                "the client's op codes are the wire's");
  if (wait.count() < 0) wait = std::chrono::milliseconds(0);
  std::lock_guard<std::mutex> lock(mutex_);
  auto fail = [&](StatusCode code, const std::string& why) {
    closeLocked();
    throwError(code, "gloo rendezvous: rank " + std::to_string(rank_) + ": " + what + " at " +
                         endpoint() + ": " + why);
  };
  const TimePoint busy_deadline = SteadyClock::now() + timeout_;
  auto backoff = kFirstBackoff;
  for (;;) {
    if (fd_ >= 0) {
      // The server closes idle or failed connections: reconnect when it has.
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) closeLocked();
    }
    if (fd_ < 0) connectLocked(SteadyClock::now() + timeout_);
    const TimePoint deadline = SteadyClock::now() + wait + kReplySlack;

    const std::string frame = rendezvousRequest(
        secret_, nonce_, op, ++seq_,
        static_cast<uint32_t>(std::min<int64_t>(wait.count(), 0x7fffffff)), key, value);
    std::string why;
    if (!sendLocked(frame, deadline, why)) fail(StatusCode::kBackend, why);
    Reply reply;
    if (!readReplyLocked(deadline, reply, why)) {
      if (SteadyClock::now() >= deadline)
        fail(StatusCode::kTimeout, "no reply within " + std::to_string(wait.count()) +
                                       " ms plus slack");
      fail(StatusCode::kBackend, why);
    }
    if (reply.status == kRdzvOk) return reply.payload;
    if (reply.status == kRdzvTimedOut)
      throwError(StatusCode::kTimeout, "gloo rendezvous: rank " + std::to_string(rank_) + ": " +
                                           what + " at " + endpoint() + " timed out after " +
                                           std::to_string(wait.count()) + " ms: " +
                                           reply.payload);
    if (reply.status != kRdzvBusy)
      fail(StatusCode::kBackend,
           reply.status == kRdzvUnauthenticated
               ? "the server rejected the request's HMAC (does TUTTI_SECRET match the job's "
                 "secret?): " + reply.payload
               : "server error: " + reply.payload);
    closeLocked();  // BUSY: the server closed it too; send again on a new connection
    if (SteadyClock::now() + backoff >= busy_deadline)
      fail(StatusCode::kTimeout, "server still busy at the deadline "
                                 "(TUTTI_START_TIMEOUT_SECONDS): " + reply.payload);
    sleepBackoff(backoff);
  }
}

void RendezvousClient::set(const std::string& key, const std::vector<char>& data) {
  request(kSet, key, std::string(data.begin(), data.end()), std::chrono::milliseconds(0),
          "SET '" + key + "'");
}

std::vector<char> RendezvousClient::get(const std::string& key) {
  std::string value = request(kGet, key, "", timeout_, "GET '" + key + "'");
  return std::vector<char>(value.begin(), value.end());
}

void RendezvousClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::string value;
  std::string names;
  for (const auto& key : keys) {
    putLittleEndian(value, key.size(), 4);
    value += key;
    names += (names.empty() ? "'" : ", '") + key + "'";
  }
  request(kWait, "", value, timeout.count() > 0 ? timeout : timeout_, "WAIT for " + names);
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  std::string value;
  putLittleEndian(value, static_cast<uint64_t>(delta), 8);
  std::string reply = request(kAdd, key, value, std::chrono::milliseconds(0),
                              "ADD '" + key + "'");
  if (reply.size() != 8)
    throwError(StatusCode::kBackend, "gloo rendezvous: ADD '" + key + "': malformed reply");
  return static_cast<int64_t>(getLittleEndian(reply.data(), 8));
}

}  // namespace detail
}  // namespace tutti
