// The in-process rendezvous server (protocol 2): one poll loop over the listener, a wake pipe
// and every connection. A connection's life:
//  1. accepted (the oldest pending connection is closed first when max_pending wait); the
//     hello with a fresh nonce is queued. It is pending: it has auth_seconds from its accept.
//  2. pending, it reads the 36-byte proof of the secret and nothing else. A wrong proof is
//     answered UNAUTHENTICATED, a good one BUSY when max_connections are authenticated
//     (both close), else OK: the connection is authenticated.
//  3. reading a request: the 32-byte header first (magic, op and sizes are checked, and the
//     body's bytes reserved in the in-flight budget, before any body byte is kept), then
//     key, value and MAC, each chunk kept only as it arrives.
//  4. the MAC and the sequence number are checked; SET and ADD answer at once and wake the
//     parked requests; GET and WAIT park until their keys are all set or their timeout passes.
//  5. the response is written (with a deadline); a refusal closes the connection after it.
// Each connection has one deadline at a time (proof, message, idle, wait or write), and poll
// never sleeps past the nearest one.
#include "backends/gloo/rendezvous_server.h"

#include "backends/gloo/rendezvous_client.h"
#include "backends/gloo/rendezvous_wire.h"
#include "base/common.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tutti {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kChunk = 64 * 1024;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A listening socket on host:port (every interface when host is empty); -1 and `why` if not.
int listenOn(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET6 : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {
      if (!host.empty()) break;
      hints.ai_family = AF_INET;  // the kernel has no IPv6
    }
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                           &hints, &list);
    if (rc != 0) {
      why = std::string("getaddrinfo: ") + gai_strerror(rc);
      continue;
    }
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        why = std::strerror(errno);
        continue;
      }
      int one = 1, zero = 0;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 4096) == 0) {
        ::freeaddrinfo(list);
        setNonBlocking(fd);
        return fd;
      }
      why = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(list);
  }
  return -1;
}

}  // namespace

struct RendezvousServer::Connection {
  int fd = -1;
  std::string nonce;
  uint64_t seq = 0;
  bool pending = false;  // has not proved the secret yet; then in pending_ at `in_pending`
  std::list<Connection*>::iterator in_pending;
  bool authenticated = false;  // holds one of max_connections
  Clock::time_point deadline;
  std::string in;  // the request being read
  bool header_known = false;
  uint8_t op = 0;
  uint64_t req_seq = 0, timeout_ms = 0, key_len = 0, value_len = 0;
  uint64_t reserved = 0;  // bytes of this request in the in-flight budget
  bool parked = false;   // a GET or WAIT waiting for keys until `deadline`
  std::vector<std::string> keys;
  std::string out;  // the response (or hello) being written
  size_t out_done = 0;
  bool close_after = false;
  bool closed = false;
};

RendezvousServer::RendezvousServer(std::string secret, RendezvousServerOptions options)
    : secret_(std::move(secret)), options_(std::move(options)) {
  if (secret_.size() < 16)
    throwError(StatusCode::kInvalidArgument,
               "rendezvous server: the secret must be at least 16 bytes (32 hex digits), got " +
                   std::to_string(secret_.size()));
  std::string why;
  listener_ = listenOn(options_.bind_host, options_.port, why);
  if (listener_ < 0)
    throwError(StatusCode::kBackend, "rendezvous server: cannot listen on " +
                                         (options_.bind_host.empty() ? std::string("*")
                                                                     : options_.bind_host) +
                                         ":" + std::to_string(options_.port) + ": " + why);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listener_);
    throwError(StatusCode::kBackend, std::string("rendezvous server: pipe: ") +
                                         std::strerror(errno));
  }
  thread_ = std::thread([this] { loop(); });
}

RendezvousServer::~RendezvousServer() {
  stop_ = true;
  char byte = 0;
  if (::write(wake_[1], &byte, 1) < 0) { /* the loop also wakes within a second */ }
  if (thread_.joinable()) thread_.join();
  for (auto& entry : conns_) ::close(entry.first);
  ::close(listener_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void RendezvousServer::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_[key] = value;
    store_changed_ = true;
  }
  char byte = 0;
  if (::write(wake_[1], &byte, 1) < 0) { /* a full pipe already wakes the loop */ }
}

void RendezvousServer::loop() {
  std::vector<pollfd> fds;
  std::vector<Connection*> order;
  while (!stop_) {
    fds.clear();
    order.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = Clock::now() >= accept_paused_until_;
    fds.push_back({listener_, static_cast<short>(accepting ? POLLIN : 0), 0});
    auto nearest = Clock::now() + std::chrono::seconds(1);
    if (!accepting) nearest = std::min(nearest, accept_paused_until_);
    for (auto& entry : conns_) {
      Connection& c = *entry.second;
      fds.push_back({c.fd, static_cast<short>(c.out.size() > c.out_done ? POLLOUT : POLLIN), 0});
      order.push_back(&c);
      nearest = std::min(nearest, c.deadline);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(nearest - Clock::now());
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (rc < 0 && errno != EINTR) break;
    if (stop_) break;
    bool changed = false;
    if (fds[0].revents) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof(drain)) > 0) {}
      std::lock_guard<std::mutex> lock(store_mutex_);
      changed = store_changed_;
      store_changed_ = false;
    }
    for (size_t i = 0; i < order.size(); ++i) {
      Connection& c = *order[i];
      if (c.closed || !fds[i + 2].revents) continue;
      try {
        if (c.out.size() > c.out_done) {
          flush(c);
        } else {
          onReadable(c);
        }
      } catch (const std::exception&) {
        close(c);  // one connection's failure never stops the server
      }
    }
    changed = changed || stored_here_;
    stored_here_ = false;
    const auto now = Clock::now();
    for (auto& entry : conns_) {
      Connection& c = *entry.second;
      if (c.closed) continue;
      if (c.parked && (changed || now >= c.deadline)) {
        try {
          tryAnswer(c);
        } catch (const std::exception&) {
          close(c);
        }
      } else if (now >= c.deadline) {
        close(c);  // proof, message, idle or write deadline passed
      }
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->closed) {
        ::close(it->first);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    try {
      if (fds[1].revents) acceptAll();  // after the closes above, which free slots
    } catch (const std::exception&) {
      // Out of memory for a connection: it was closed; the next ones are tried next round.
    }
    connections_ = authenticated_;
    pending_count_ = pending_.size();
  }
}

void RendezvousServer::acceptAll() {
  for (int i = 0; i < 256; ++i) {  // bounded per round; poll reports the rest again
    int fd = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_until_ = after(0.05);  // out of descriptors: let deadlines free some
      return;
    }
    std::unique_ptr<Connection> c;
    try {
      c = std::make_unique<Connection>();
      c->nonce.resize(kRendezvousNonceBytes);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&c->nonce[0]), kRendezvousNonceBytes) != 1) {
      ::close(fd);
      continue;
    }
    if (pending_.size() >= options_.max_pending) close(*pending_.front());  // the oldest goes
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->deadline = after(options_.auth_seconds);
    c->out = "TUTH";
    c->out.push_back(kRendezvousVersion);
    c->out += c->nonce;
    Connection& ref = *c;
    conns_[fd] = std::move(c);
    try {
      ref.in_pending = pending_.insert(pending_.end(), &ref);
    } catch (...) {
      close(ref);
      throw;
    }
    ref.pending = true;
    flush(ref);
  }
}

void RendezvousServer::onReadable(Connection& c) {
  char chunk[kChunk];
  const uint64_t total = c.pending ? kRendezvousProofBytes
                         : c.header_known ? kRendezvousRequestHeaderBytes + c.key_len +
                                                c.value_len + kRendezvousMacBytes
                                          : kRendezvousRequestHeaderBytes;
  const size_t want = c.parked ? 1 : static_cast<size_t>(std::min<uint64_t>(
                                          kChunk, total - c.in.size()));
  ssize_t n = ::recv(c.fd, chunk, want, 0);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (n <= 0 || c.parked) return close(c);  // closed, reset, or a request while one waits
  if (c.in.empty() && !c.pending) c.deadline = after(options_.message_seconds);
  c.in.append(chunk, n);
  if (c.pending) {
    if (c.in.size() == kRendezvousProofBytes) onProof(c);
    return;
  }
  if (!c.header_known && c.in.size() == kRendezvousRequestHeaderBytes) {
    const char* h = c.in.data();
    c.op = static_cast<uint8_t>(h[4]);
    c.req_seq = getLittleEndian(h + 8, 8);
    c.timeout_ms = getLittleEndian(h + 16, 4);
    c.key_len = getLittleEndian(h + 20, 4);
    c.value_len = getLittleEndian(h + 24, 8);
    if (std::memcmp(h, "TUTQ", 4) != 0 || c.op < kRdzvSet || c.op > kRdzvAdd)
      return refuse(c, kRdzvBadRequest, "malformed request");
    if (c.key_len > kRendezvousMaxKey || c.value_len > kRendezvousMaxValue)
      return refuse(c, kRdzvBadRequest,
                    "request too large: key " + std::to_string(c.key_len) + " bytes (max " +
                        std::to_string(kRendezvousMaxKey) + "), value " +
                        std::to_string(c.value_len) + " bytes (max " +
                        std::to_string(kRendezvousMaxValue) + ")");
    const uint64_t need = c.key_len + c.value_len + kRendezvousMacBytes;
    if (inflight_bytes_ + need > options_.max_inflight_bytes && inflight_bytes_ > 0)
      return refuse(c, kRdzvBusy, "server busy: too many large requests in flight; retry");
    inflight_bytes_ += need;
    c.reserved = need;
    c.header_known = true;
  }
  if (c.header_known && c.in.size() == kRendezvousRequestHeaderBytes + c.key_len + c.value_len +
                                           kRendezvousMacBytes)
    onRequest(c);
}

void RendezvousServer::onProof(Connection& c) {
  c.pending = false;
  pending_.erase(c.in_pending);
  const std::string proof = c.in;
  c.in.clear();
  if (!macEqual(proof, rendezvousProof(secret_, c.nonce)))
    return refuse(c, kRdzvUnauthenticated, "the proof of the job secret (HMAC) does not match");
  if (authenticated_ >= options_.max_connections)
    return refuse(c, kRdzvBusy, "server busy: all " + std::to_string(options_.max_connections) +
                                    " connection slots are taken; retry");
  c.authenticated = true;
  ++authenticated_;
  respond(c, kRdzvOk, "");  // seq 0
}

void RendezvousServer::onRequest(Connection& c) {
  inflight_bytes_ -= c.reserved;  // the bytes are read: what they take is `c.in` until below
  c.reserved = 0;
  const size_t signed_bytes = c.in.size() - kRendezvousMacBytes;
  const std::string expect =
      hmacSha256(secret_, "tutti-rdzv-req" + c.nonce + c.in.substr(0, signed_bytes));
  if (!macEqual(expect, c.in.substr(signed_bytes)))
    return refuse(c, kRdzvUnauthenticated, "HMAC does not match the job secret");
  if (c.req_seq != c.seq + 1)
    return refuse(c, kRdzvUnauthenticated, "sequence " + std::to_string(c.req_seq) +
                                               ", expected " + std::to_string(c.seq + 1) +
                                               " (replay?)");
  c.seq = c.req_seq;
  const std::string key = c.in.substr(kRendezvousRequestHeaderBytes, c.key_len);
  const std::string value = c.in.substr(kRendezvousRequestHeaderBytes + c.key_len, c.value_len);
  c.in.clear();
  c.header_known = false;
  c.keys.clear();
  if (c.op == kRdzvSet || c.op == kRdzvAdd) stored_here_ = true;
  if (c.op == kRdzvSet) {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_[key] = value;
  } else if (c.op == kRdzvAdd) {
    if (value.size() != 8) return refuse(c, kRdzvBadRequest, "ADD: value must be an 8-byte delta");
    std::string reply;
    {
      std::lock_guard<std::mutex> lock(store_mutex_);
      auto it = store_.find(key);
      if (it != store_.end() && it->second.size() != 8)
        return refuse(c, kRdzvBadRequest, "ADD: key '" + key + "' holds a non-counter value");
      const uint64_t old = it == store_.end() ? 0 : getLittleEndian(it->second.data(), 8);
      putLittleEndian(reply, old + getLittleEndian(value.data(), 8), 8);
      store_[key] = reply;
    }
    return respond(c, kRdzvOk, reply);
  } else if (c.op == kRdzvGet) {
    c.keys.push_back(key);
  } else {
    for (size_t pos = 0; pos < value.size();) {
      if (pos + 4 > value.size()) return refuse(c, kRdzvBadRequest, "WAIT: truncated key list");
      const uint64_t n = getLittleEndian(value.data() + pos, 4);
      if (n > kRendezvousMaxKey || pos + 4 + n > value.size())
        return refuse(c, kRdzvBadRequest, "WAIT: bad key length");
      c.keys.push_back(value.substr(pos + 4, n));
      pos += 4 + n;
    }
  }
  if (c.op == kRdzvSet) return respond(c, kRdzvOk, "");
  c.parked = true;
  c.timeout_ms = std::min<uint64_t>(c.timeout_ms, kRendezvousMaxWaitMs);
  c.deadline = Clock::now() + std::chrono::milliseconds(c.timeout_ms);
  tryAnswer(c);
}

bool RendezvousServer::tryAnswer(Connection& c) {
  std::vector<std::string> missing;
  std::string value;
  {
    std::lock_guard<std::mutex> lock(store_mutex_);
    for (const auto& key : c.keys) {
      auto it = store_.find(key);
      if (it == store_.end()) missing.push_back(key);
      else value = it->second;
    }
  }
  const std::string ms = std::to_string(c.timeout_ms);
  if (missing.empty()) {
    c.parked = false;
    respond(c, kRdzvOk, c.op == kRdzvGet ? value : std::string());
    return true;
  }
  if (Clock::now() < c.deadline) return false;
  c.parked = false;
  if (c.op == kRdzvGet) {
    respond(c, kRdzvTimedOut, "key '" + missing[0] + "' not set after " + ms + " ms");
  } else {
    std::string names;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) names += (i ? ", " : "") + missing[i];
    respond(c, kRdzvTimedOut, "keys not set after " + ms + " ms: " + names);
  }
  return true;
}

void RendezvousServer::respond(Connection& c, uint8_t status, const std::string& payload) {
  c.out = rendezvousResponse(secret_, c.nonce, status, c.req_seq, payload);
  c.out_done = 0;
  c.deadline = after(options_.message_seconds);
  flush(c);
}

void RendezvousServer::refuse(Connection& c, uint8_t status, const std::string& message) {
  ++(status == kRdzvBusy ? busy_ : rejected_);
  c.parked = false;
  c.close_after = true;
  respond(c, status, message);
}

void RendezvousServer::flush(Connection& c) {
  while (c.out_done < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll waits for POLLOUT
    if (n <= 0) return close(c);
    c.out_done += static_cast<size_t>(n);
  }
  c.out.clear();
  c.out_done = 0;
  if (c.close_after) return close(c);
  // After the hello the deadline of the proof stays; after a response, the idle one.
  if (!c.pending) c.deadline = after(options_.idle_seconds);
}

void RendezvousServer::close(Connection& c) {
  if (c.closed) return;
  c.closed = true;
  if (c.pending) {
    c.pending = false;
    pending_.erase(c.in_pending);
    ++dropped_;
  }
  if (c.authenticated) --authenticated_;
  c.authenticated = false;
  inflight_bytes_ -= c.reserved;
  c.reserved = 0;
  ::shutdown(c.fd, SHUT_RDWR);  // the fd itself is closed by the loop, after this round
}

}  // namespace detail
}  // namespace tutti
