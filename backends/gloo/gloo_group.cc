#include "backends/gloo/gloo_group.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <typeinfo>

// gloo::transport::tcp::Pair::tryRecv, which libgloo exports. Debian's libgloo-dev cannot
// declare it: its gloo/transport/tcp/pair.h includes gloo/common/memory.h, which the package
// lacks. Bound by its (Itanium C++ ABI) name: a non-virtual member function takes the object
// as its first argument. Weak: with a gloo that lacks it (another snapshot) the symbol is
// null, the watch finds nothing and a broken connection is noticed at the op's deadline.
extern "C++" bool glooTcpPairTryRecv(void* pair, gloo::transport::UnboundBuffer* buf,
                                     unsigned long slot, unsigned long offset,
                                     unsigned long bytes)
    __asm__("_ZN4gloo9transport3tcp4Pair7tryRecvEPNS0_13UnboundBufferEmmm") __attribute__((weak));

namespace tutti {
namespace detail {
namespace {

constexpr uint8_t kExchangeSlotPrefix = 0x40;  // gloo's own algorithms use 0x01..0x08
constexpr uint8_t kProbeSlotPrefix = 0x41;     // nothing is ever sent on it
constexpr auto kWatchPeriod = std::chrono::milliseconds(200);

// "" while the connection to `peer` is up; else gloo's error for it. A receive tried on a
// slot nobody sends on is gloo's only public call that checks a tcp pair's error and, when
// there is none, changes nothing (no notification goes to the peer).
std::string brokenConnection(gloo::Context& context, int peer,
                             gloo::transport::UnboundBuffer* probe) {
  gloo::transport::Pair* pair = context.getPair(peer).get();
  // tcp::Pair's first base is transport::Pair: the same address.
  if (!glooTcpPairTryRecv || !pair ||
      std::strcmp(typeid(*pair).name(), "N4gloo9transport3tcp4PairE") != 0) {
    return "";
  }
  try {
    glooTcpPairTryRecv(pair, probe, gloo::Slot::build(kProbeSlotPrefix, 0), 0, 0);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::chrono::milliseconds timeoutFor(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 1 ? std::chrono::milliseconds(1) : left;
}

// gloo pairs a send with a receive of the same slot and compares their sizes only on its
// own device thread: a send larger than the receive is an EnforceNotMet there, which no
// caller can catch (std::terminate), and a smaller one completes the receive short,
// silently. So the slot of a pair's messages in one exchange also carries the bytes that
// pair moves (folded into gloo's 24 low slot bits): ranks that disagree on a size never
// match, and the receive fails at its deadline naming the peer and the bytes expected.
uint64_t slotFor(uint64_t base, size_t pair_bytes) {
  const uint64_t b = pair_bytes;
  return base | ((b ^ (b >> 24) ^ (b >> 48)) & 0xffffff);
}

bool isTimeout(const std::string& message) {
  return message.find("Timed out") != std::string::npos ||
         message.find("timed out") != std::string::npos;
}

}  // namespace

void GlooPoison::attach(GlooGroup* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(group);
  const Status first = first_.status();
  if (!first.ok()) group->interrupt(first.code(), first.message());
}

void GlooPoison::detach(GlooGroup* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.erase(std::remove(groups_.begin(), groups_.end(), group), groups_.end());
}

void GlooPoison::spread(GlooGroup* origin, StatusCode code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_.set(code, message)) return;
  for (GlooGroup* group : groups_)
    if (group != origin) group->interrupt(code, message);
}

void GlooPoison::setStoppedPeersProbe(std::function<std::string()> probe) {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  probe_ = std::move(probe);
}

std::string GlooPoison::stoppedPeers() {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  if (!probe_) return "";
  try {
    return probe_();
  } catch (const std::exception&) {
    return "";  // a best effort for a message: the timeout is reported anyway
  }
}

GlooGroup::GlooGroup(std::shared_ptr<gloo::Context> context, std::vector<int> ranks, int id,
                     std::string kind, std::shared_ptr<GlooPoison> poison)
    : context_(std::move(context)),
      ranks_(std::move(ranks)),
      id_(id),
      kind_(std::move(kind)),
      transport_poison_(std::move(poison)),
      probe_(context_->createUnboundBuffer(&probe_byte_, sizeof(probe_byte_))),
      watcher_([this] { watch(); }) {
  if (transport_poison_) transport_poison_->attach(this);
}

GlooGroup::~GlooGroup() {
  if (transport_poison_) transport_poison_->detach(this);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();
}

void GlooGroup::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    watch_cv_.wait_for(lock, kWatchPeriod);
    if (stopping_ || live_.empty() || broken_exchange_ == exchange_) continue;
    const uint64_t exchange = exchange_;
    const std::vector<int> peers = watched_;
    lock.unlock();
    int peer = -1;
    std::string broken;
    for (size_t i = 0; i < peers.size() && broken.empty(); ++i) {
      peer = peers[i];
      broken = brokenConnection(*context_, peer, probe_.get());
    }
    lock.lock();
    if (broken.empty() || exchange != exchange_ || live_.empty()) continue;
    broken_exchange_ = exchange;
    broken_peer_ = peer;
    broken_ = broken;
    for (auto* buf : live_) {
      buf->abortWaitRecv();
      buf->abortWaitSend();
    }
  }
}

std::string GlooGroup::label(const std::string& what) const {
  return "gloo " + kind_ + " " + what + " (process set " + std::to_string(id_) + ", rank " +
         std::to_string(rank()) + " of " + std::to_string(size()) + ", world rank " +
         std::to_string(ranks_[rank()]) + ")";
}

void GlooGroup::fail(StatusCode code, const std::string& message) {
  if (poisonLocal(code, message) && transport_poison_)
    transport_poison_->spread(this, code, message);
  throwError(code, message);
}

bool GlooGroup::poisonLocal(StatusCode code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_.set(code, message)) return false;
    for (auto* buf : live_) {
      buf->abortWaitRecv();
      buf->abortWaitSend();
    }
  }
  // Closing our end makes every peer's pending operation fail instead of waiting out its
  // own deadline.
  try {
    context_->closeConnections();
  } catch (...) {
  }
  return true;
}

void GlooGroup::run(const std::string& what, Deadline deadline,
                    const std::function<void(std::chrono::milliseconds)>& fn) {
  if (poison_.isSet())
    poison_.throwIfSet(label(what) + " refused: an earlier failure poisoned this group: ");
  if (secondsLeft(deadline) <= 0)
    fail(StatusCode::kTimeout, label(what) + ": deadline passed before the operation began");
  const auto started = Clock::now();
  auto elapsed = [&] {
    return std::to_string(std::chrono::duration<double>(Clock::now() - started).count());
  };
  try {
    fn(timeoutFor(deadline));
    return;
  } catch (const Error& e) {
    fail(e.code(), e.what());
  } catch (const gloo::Exception& e) {
    const bool timeout = isTimeout(e.what());
    fail(timeout ? StatusCode::kTimeout : StatusCode::kBackend,
         label(what) + (timeout ? " timed out after " : " failed after ") + elapsed() +
             " s (a peer is missing, slow or dead): " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    fail(StatusCode::kBackend, label(what) + " failed: " + e.what());
  } catch (const std::exception& e) {
    fail(StatusCode::kBackend, label(what) + " failed: " + e.what());
  }
}

void GlooGroup::exchange(const std::string& what, const void* send_buf, size_t send_size,
                         const std::vector<Transfer>& sends, void* recv_buf, size_t recv_size,
                         const std::vector<Transfer>& recvs, uint32_t tag, Deadline deadline,
                         const std::function<void(size_t)>& on_recv) {
  run(what, deadline, [&](std::chrono::milliseconds) {
    const uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, tag);
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
    if (send_size > 0)
      out = context_->createUnboundBuffer(const_cast<void*>(send_buf), send_size);
    if (recv_size > 0) in = context_->createUnboundBuffer(recv_buf, recv_size);
    // 1. Make the buffers visible to abort() (unless it already ran), and the peers to the
    // watcher.
    {
      std::set<int> peers;
      for (const auto& t : recvs)
        if (t.bytes > 0) peers.insert(t.peer);
      for (const auto& t : sends)
        if (t.bytes > 0) peers.insert(t.peer);
      std::lock_guard<std::mutex> lock(mutex_);
      poison_.throwIfSet();
      if (out) live_.push_back(out.get());
      if (in) live_.push_back(in.get());
      watched_.assign(peers.begin(), peers.end());
      ++exchange_;
    }
    struct Unregister {
      GlooGroup* group;
      ~Unregister() {
        std::lock_guard<std::mutex> lock(group->mutex_);
        group->live_.clear();
        group->watched_.clear();
      }
    } unregister{this};
    // 2. Post every receive and send (empty ones skipped: both sides know the sizes), on
    // slots that carry each pair's bytes (slotFor).
    std::map<int, size_t> recv_bytes, send_bytes;  // per peer, this exchange
    for (const auto& t : recvs) recv_bytes[t.peer] += t.bytes;
    for (const auto& t : sends) send_bytes[t.peer] += t.bytes;
    std::multiset<int> pending_sends, pending_recvs;
    std::map<int, std::deque<size_t>> recv_order;  // per peer: indices into recvs, as posted
    // A post fails at once when the connection to that peer is already broken.
    auto broke = [&](int peer, bool is_recv, const std::string& error) {
      const std::string rank = std::to_string(ranks_[peer]);
      fail(StatusCode::kBackend,
           label(what) + " failed " + (is_recv ? "receiving from" : "sending to") +
               " world rank(s) " + rank + " (" +
               std::to_string(is_recv ? recv_bytes[peer] : send_bytes[peer]) +
               " bytes): the connection to world rank " + rank +
               " broke (that rank failed, left or closed it): " + error);
    };
    for (size_t i = 0; i < recvs.size(); ++i) {
      const auto& t = recvs[i];
      if (t.bytes == 0) continue;
      try {
        in->recv(t.peer, slotFor(slot, recv_bytes[t.peer]), t.offset, t.bytes);
      } catch (const gloo::Exception& e) {
        broke(t.peer, true, e.what());
      }
      pending_recvs.insert(t.peer);
      if (on_recv) recv_order[t.peer].push_back(i);
    }
    for (const auto& t : sends) {
      if (t.bytes == 0) continue;
      try {
        out->send(t.peer, slotFor(slot, send_bytes[t.peer]), t.offset, t.bytes);
      } catch (const gloo::Exception& e) {
        broke(t.peer, false, e.what());
      }
      pending_sends.insert(t.peer);
    }
    auto waiting = [&](const std::multiset<int>& peers, bool is_recv) {
      std::string text;
      for (int peer : std::set<int>(peers.begin(), peers.end()))
        text += (text.empty() ? "" : ", ") + std::to_string(ranks_[peer]) + " (" +
                std::to_string(is_recv ? recv_bytes[peer] : send_bytes[peer]) + " bytes)";
      return text;
    };
    // 3. Wait for each, naming the peers still awaited if the deadline passes.
    auto wait = [&](gloo::transport::UnboundBuffer* buf, std::multiset<int>& pending,
                    bool is_recv) {
      while (!pending.empty()) {
        int peer = -1;
        bool done = false;
        try {
          done = is_recv ? buf->waitRecv(&peer, timeoutFor(deadline))
                         : buf->waitSend(&peer, timeoutFor(deadline));
        } catch (const gloo::Exception& e) {
          const bool timeout = isTimeout(e.what());
          const std::string stopped =
              transport_poison_ ? transport_poison_->stoppedPeers() : "";
          fail(timeout ? StatusCode::kTimeout : StatusCode::kBackend,
               (stopped.empty() ? "" : stopped + ": ") + label(what) +
                   (timeout ? " timed out " : " failed ") +
                   (is_recv ? "receiving from" : "sending to") + " world rank(s) " +
                   waiting(pending, is_recv) +
                   (timeout ? " (that rank is missing, slow or dead, or it moves a different "
                              "number of bytes in this op): "
                            : ": ") +
                   e.what());
        }
        if (!done) {  // abort() woke us, after it set the poison, or the watcher did
          std::string broken;
          int broken_peer = -1;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (broken_exchange_ == exchange_) {
              broken = broken_;
              broken_peer = broken_peer_;
            }
          }
          if (!broken.empty())
            fail(StatusCode::kBackend,
                 label(what) + " failed " + (is_recv ? "receiving from" : "sending to") +
                     " world rank(s) " + waiting(pending, is_recv) +
                     ": the connection to world rank " + std::to_string(ranks_[broken_peer]) +
                     " broke (that rank failed, left or closed it): " + broken);
          poison_.throwIfSet(label(what) + " interrupted: ");
          throwError(StatusCode::kAborted, label(what) + " interrupted");
        }
        auto it = pending.find(peer);
        if (it == pending.end()) it = pending.begin();
        const int done_peer = *it;
        pending.erase(it);
        if (is_recv && on_recv) {
          auto& order = recv_order[done_peer];
          const size_t index = order.front();
          order.pop_front();
          on_recv(index);
        }
      }
    };
    wait(in.get(), pending_recvs, true);
    wait(out.get(), pending_sends, false);
  });
}

void GlooGroup::abort(const std::string& reason) {
  const std::string message = label("abort") + ": " + reason;
  if (poisonLocal(StatusCode::kAborted, message) && transport_poison_)
    transport_poison_->spread(this, StatusCode::kAborted, message);
}

void GlooGroup::interrupt(StatusCode code, const std::string& message) {
  poisonLocal(code, "another gloo group of this process failed first: " + message);
}

}  // namespace detail
}  // namespace tutti
