// Runs a body on N Runtimes in N threads, connected by one loopback hub: threads as ranks.
#pragma once

#include "backends/loopback/loopback.h"
#include "core/runtime.h"
#include "test/backends/backend_test_util.h"

#include <functional>
#include <thread>

namespace tutti {
namespace test {

struct RankContext {
  Runtime& rt;
  int rank;
  int size;
  Failures& failures;

  void fail(const std::string& message) {
    failures.add("rank " + std::to_string(rank) + ": " + message);
  }
  void expectOk(const Status& s, const std::string& what) {
    if (!s.ok()) fail(what + ": " + s.message());
  }
};

inline Config testConfig(int rank, int size) {
  Config c;
  c.topology.rank = rank;
  c.topology.size = size;
  c.topology.local_rank = rank;
  c.topology.local_size = size;
  c.topology.source = "test threads";
  c.timeout_seconds = 30;
  c.stall_check_disable = true;
  return c;
}

inline void runRanks(int n, const std::function<void(RankContext&)>& body, Failures& failures,
                     const std::function<void(Config&)>& tweak = nullptr) {
  auto hub = makeLoopbackHub(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Config c = testConfig(r, n);
        if (tweak) tweak(c);
        Runtime rt(c, makeLoopbackTransport(hub, r));
        RankContext ctx{rt, r, n, failures};
        body(ctx);
        rt.shutdown();
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
}

inline TensorEntry makeTestEntry(OpType op, const std::string& name, std::vector<int64_t> shape,
                                 DataType dtype, const void* in, void* out) {
  TensorEntry e;
  e.request.op = op;
  e.request.name = name;
  e.request.shape = std::move(shape);
  e.request.dtype = dtype;
  e.input = in;
  e.output = out;
  return e;
}

inline Status submitOne(Runtime& rt, TensorEntry e, Handle* h, int set = 0) {
  std::vector<TensorEntry> entries;
  entries.push_back(std::move(e));
  return rt.submit(set, std::move(entries), nullptr, h);
}

// A counter of rt.stats() ("rounds.with_work"), -1 when it has none of that name.
inline int64_t statOf(const Runtime& rt, const std::string& name) {
  for (const auto& kv : rt.stats())
    if (kv.first == name) return kv.second;
  return -1;
}

// Polls (every 5 ms, for at most `seconds`) until rt has stopped; returns its sticky status
// (OK if it had not stopped by then).
inline Status waitUntilStopped(const Runtime& rt, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (rt.stoppedStatus().ok() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return rt.stoppedStatus();
}

inline Status runOne(Runtime& rt, TensorEntry e, Result* result = nullptr, int set = 0) {
  Handle h = 0;
  Status s = submitOne(rt, std::move(e), &h, set);
  return s.ok() ? rt.wait(h, 30, result) : s;
}

}  // namespace test
}  // namespace tutti
