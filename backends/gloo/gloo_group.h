// One connected gloo context for one process set (control plane or data plane), with the
// error discipline every transfer goes through: deadline -> gloo timeout, gloo exception ->
// tutti::Error naming op, group, rank and the peers still awaited, and poisoning.
// All data moves through exchange(), whose gloo buffers abort() can wake from any thread.
//
// A watcher thread per group checks, every 200 ms while an exchange() waits, the connections
// to the peers it waits on: gloo never wakes a send (or receive) whose bytes were in flight
// when the peer reset the connection (its tcp pair signals only bound buffers and queued
// unbound operations), so without it the wait would last until the deadline. A broken
// connection wakes the exchange, which fails naming that peer.
//
// Thread-safety: run()/exchange() are called by one thread (the background thread);
// abort() may be called from any thread. Owns its context (shared with nothing else).
#pragma once

#include "base/common.h"
#include "base/first_error.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tutti {
namespace detail {

class GlooGroup;

// Shared by every group of one transport: the first failure (or abort) in any group
// poisons all of them, so that every later call, on any process set or plane, fails fast
// with that first error. Thread-safe.
class GlooPoison {
 public:
  void attach(GlooGroup* group);
  void detach(GlooGroup* group);
  // Poisons every attached group but `origin` (and groups attached later).
  void spread(GlooGroup* origin, StatusCode code, const std::string& message);

  // The transport's way to name the world ranks on this host that are stopped or gone
  // (describeStoppedPeers over the processes it recorded); cleared (nullptr) when the
  // transport goes. stoppedPeers() runs it: "" when there is none or none is stopped.
  void setStoppedPeersProbe(std::function<std::string()> probe);
  std::string stoppedPeers();

 private:
  std::mutex mutex_;  // guards groups_; held while spreading
  std::vector<GlooGroup*> groups_;
  FirstError first_;
  std::mutex probe_mutex_;  // guards probe_ (held while it runs)
  std::function<std::string()> probe_;
};

class GlooGroup {
 public:
  // `ranks` are the members' world ranks (sorted); `kind` is "control" or "data".
  GlooGroup(std::shared_ptr<gloo::Context> context, std::vector<int> ranks, int id,
            std::string kind, std::shared_ptr<GlooPoison> poison);
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int rank() const { return context_->rank; }
  int size() const { return context_->size; }
  int worldRank(int group_rank) const { return ranks_[group_rank]; }
  const std::shared_ptr<gloo::Context>& context() const { return context_; }

  // Runs fn(timeout left) unless poisoned. Any failure poisons the group (and closes its
  // connections, so peers fail fast) and throws Error(kTimeout / kBackend / kAborted)
  // "gloo <kind> <what> (process set <id>, rank r of n, world rank w): ...".
  void run(const std::string& what, Deadline deadline,
           const std::function<void(std::chrono::milliseconds)>& fn);

  // Point-to-point: one message per Transfer (empty ones skipped), all posted at once, then
  // waited for; receives first, and on_recv(i) runs as soon as recvs[i] has arrived
  // (messages from one peer arrive in the order posted). `tag` separates consecutive
  // exchanges of one op.
  struct Transfer {
    int peer;  // group rank
    size_t offset;
    size_t bytes;
  };
  void exchange(const std::string& what, const void* send_buf, size_t send_size,
                const std::vector<Transfer>& sends, void* recv_buf, size_t recv_size,
                const std::vector<Transfer>& recvs, uint32_t tag, Deadline deadline,
                const std::function<void(size_t)>& on_recv = nullptr);

  // Poisons the group, wakes a transfer blocked in exchange() (it throws kAborted) and
  // closes the connections so that peers fail fast.
  void abort(const std::string& reason);

  // Poisoned through the transport by another group's failure; wakes and closes like abort.
  void interrupt(StatusCode code, const std::string& message);

 private:
  std::string label(const std::string& what) const;
  [[noreturn]] void fail(StatusCode code, const std::string& message);
  // Sets the poison unless set, wakes a blocked exchange, closes the connections; true if
  // this call set it.
  bool poisonLocal(StatusCode code, const std::string& message);
  // The watcher thread's loop (see the top of this file).
  void watch();

  std::shared_ptr<gloo::Context> context_;
  const std::vector<int> ranks_;
  const int id_;
  const std::string kind_;
  const std::shared_ptr<GlooPoison> transport_poison_;
  std::mutex mutex_;  // guards live_; the poison is set under it too
  std::vector<gloo::transport::UnboundBuffer*> live_;  // buffers of the running exchange()
  FirstError poison_;
  // The watcher's state, guarded by mutex_: the group ranks the running exchange() waits on
  // (exchange_ counts the exchanges), and the first broken connection it found in one.
  std::vector<int> watched_;
  uint64_t exchange_ = 0;
  uint64_t broken_exchange_ = 0;  // the exchange in which broken_ was found (0: none)
  int broken_peer_ = -1;
  std::string broken_;
  bool stopping_ = false;
  std::condition_variable watch_cv_;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe_;  // the watcher's (never filled)
  char probe_byte_ = 0;
  std::thread watcher_;  // last: started when everything above is ready
};

}  // namespace detail
}  // namespace tutti
