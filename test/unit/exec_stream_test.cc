// The execution stream: backend switches flip between the same two plans on every rank with
// pipelined rounds on, and the stream's commands run in order (threads as ranks).
#include "test/catch.h"
#include "test/unit/rank_threads.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>

namespace tutti {
namespace test {
namespace {

// The transport's backend wrapped: it has a hierarchical allreduce switch (which changes
// nothing of the data) and records, per allreduce call, the switch as that call read it.
// On a "slow" rank the first allreduce waits (up to `gate_seconds`) for the switch to
// change before it reads it: a flip applied while the data plane is inside that call shows
// as a call that read different states on two ranks.
class RecordingBackend : public Backend {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, std::vector<bool>* calls, bool slow,
                   double gate_seconds)
      : inner_(std::move(inner)), calls_(*calls), slow_(slow), gate_seconds_(gate_seconds) {}
  const char* name() const override { return "recording"; }
  bool supports(OpType op, DataType dtype, DeviceType device) const override {
    return inner_->supports(op, dtype, device);
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* algorithm(OpType op, int64_t bytes) const override {
    return inner_->algorithm(op, bytes);
  }
  void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    if (slow_ && calls_.empty()) {
      const auto until = Clock::now() + std::chrono::duration<double>(gate_seconds_);
      while (!changed_.load() && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    calls_.push_back(on_.load());
    inner_->allreduce(in, out, count, dtype, op, deadline);
  }
  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts,
                  DataType dtype, Deadline deadline) override {
    inner_->allgatherv(in, out, counts, dtype, deadline);
  }
  void broadcast(void* buf, int64_t count, DataType dtype, int root,
                 Deadline deadline) override {
    inner_->broadcast(buf, count, dtype, root, deadline);
  }
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    inner_->alltoallv(in, send_counts, out, recv_counts, dtype, deadline);
  }
  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    inner_->reducescatter(in, out, counts, dtype, op, deadline);
  }
  void barrier(Deadline deadline) override { inner_->barrier(deadline); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  int switchState(BackendSwitch which) const override {
    return which == BackendSwitch::kHierarchicalAllreduce ? (on_.load() ? 1 : 0) : -1;
  }
  bool setSwitch(BackendSwitch which, bool on) override {
    if (which != BackendSwitch::kHierarchicalAllreduce) return false;
    if (on_.exchange(on) != on) changed_ = true;
    return true;
  }
 private:
  std::unique_ptr<Backend> inner_;
  std::vector<bool>& calls_;  // the switch as each allreduce read it; the data plane's thread
  const bool slow_;
  const double gate_seconds_;
  std::atomic<bool> on_{false}, changed_{false};
};

// The loopback transport whose process set 0 gets a RecordingBackend writing to `calls`.
class RecordingTransport : public Transport {
 public:
  RecordingTransport(std::unique_ptr<Transport> inner, std::vector<bool>* calls, bool slow,
                     double gate_seconds)
      : inner_(std::move(inner)), calls_(calls), slow_(slow), gate_seconds_(gate_seconds) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks, int id) override {
    return inner_->makeControlPlane(ranks, id);
  }
  std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) override {
    if (id != 0) return inner_->makeBackend(ranks, id);
    return std::make_unique<RecordingBackend>(inner_->makeBackend(ranks, id), calls_, slow_,
                                              gate_seconds_);
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::vector<bool>* calls_;
  const bool slow_;
  const double gate_seconds_;
};

// A one-member set's data plane for the stream alone: allreduce reads the switch, then
// sleeps `hold_ms` (the stream's thread busy) or throws a timeout.
class HoldingBackend : public Backend {
 public:
  HoldingBackend(int hold_ms, bool fail) : hold_ms_(hold_ms), fail_(fail) {}
  const char* name() const override { return "holding"; }
  bool supports(OpType op, DataType, DeviceType device) const override {
    return op == OpType::kAllreduce && device == DeviceType::kCpu;
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* algorithm(OpType, int64_t) const override { return "hold"; }
  void allreduce(const void*, void*, int64_t, DataType, ReduceOp, Deadline) override {
    read.push_back(on_.load());
    if (fail_) throwError(StatusCode::kTimeout, "holding allreduce: no peer answered");
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms_));
  }
  void allgatherv(const void*, void*, const std::vector<int64_t>&, DataType, Deadline) override {}
  void broadcast(void*, int64_t, DataType, int, Deadline) override {}
  void alltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                 DataType, Deadline) override {}
  void reducescatter(const void*, void*, const std::vector<int64_t>&, DataType, ReduceOp,
                     Deadline) override {}
  void barrier(Deadline) override {}
  void abort(const std::string&) override {}
  int switchState(BackendSwitch) const override { return on_.load() ? 1 : 0; }
  bool setSwitch(BackendSwitch, bool on) override {
    on_ = on;
    return true;
  }
  std::vector<bool> read;  // the switch as each allreduce read it (the stream's thread)

 private:
  const int hold_ms_;
  const bool fail_;
  std::atomic<bool> on_{false};
};

// A one-member set whose queue holds nothing: its allreduces run as a joined rank's (zeros).
std::shared_ptr<ProcessSet> holdingSet(int hold_ms, bool fail, HoldingBackend** backend) {
  auto set = std::make_shared<ProcessSet>(0, std::vector<int>{0}, 0, 0);
  auto b = std::make_unique<HoldingBackend>(hold_ms, fail);
  *backend = b.get();
  set->backends.push_back(std::move(b));
  return set;
}

RunPlan bigPlan(const std::shared_ptr<ProcessSet>& set, const std::string& name) {
  Response r;
  r.names = {name};
  r.counts = {ExecStream::kInlineBytes / 4};
  return RunPlan{set, {r}, ExecStream::kInlineBytes, nullptr};
}

}  // namespace

TEST_CASE("the execution stream runs commands in order: a switch enqueued behind a running plan waits for it") {
  Config config;
  Stats stats;
  ExecStream stream(config, stats, [](const Response&) {}, [](const Status&) {});
  stream.start();
  HoldingBackend* backend = nullptr;
  auto set = holdingSet(50, false, &backend);
  stream.enqueue(bigPlan(set, "first"));
  stream.enqueue(SetBackendSwitch{{set}, BackendSwitch::kHierarchicalAllreduce, true});
  stream.enqueue(bigPlan(set, "second"));
  CHECK(stream.pendingTensors() >= 1);
  stream.drain();
  CHECK(stream.idle());
  CHECK(stream.pendingTensors() == 0);
  REQUIRE(backend->read.size() == 2);
  CHECK_FALSE(backend->read[0]);  // the switch came after the first plan
  CHECK(backend->read[1]);
  // Idle: a switch runs on the caller at once.
  stream.enqueue(SetBackendSwitch{{set}, BackendSwitch::kHierarchicalAllreduce, false});
  CHECK(backend->switchState(BackendSwitch::kHierarchicalAllreduce) == 0);
}

TEST_CASE("a command that fails on the stream's thread is fatal: reported once, drain throws it, nothing more runs") {
  Config config;
  Stats stats;
  std::mutex mu;
  std::vector<std::string> errors;
  ExecStream stream(config, stats, [](const Response&) {}, [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(s.message());
  });
  stream.start();
  HoldingBackend* backend = nullptr;
  auto set = holdingSet(0, true, &backend);
  stream.enqueue(bigPlan(set, "doomed"));
  stream.enqueue(bigPlan(set, "never"));
  std::string thrown;
  try {
    stream.drain();
  } catch (const Error& e) {
    thrown = e.what();
  }
  CHECK(thrown.find("'doomed'") != std::string::npos);
  CHECK(thrown.find("no peer answered") != std::string::npos);
  CHECK(stream.failure().code() == StatusCode::kTimeout);
  stream.stop();
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == thrown);
  CHECK(backend->read.size() == 1);  // "never" did not run
}

TEST_CASE("an autotune backend switch with pipelined rounds lands between the same two plans on every rank") {
  // Rank 1's first allreduce holds the data plane until its switch changes (at most 2 s)
  // while both ranks go on submitting, one op per round (each too large to run inline):
  // autotune (1 ms windows, every 4 rounds) reaches its hierarchical stage and flips the
  // switch meanwhile. Applied by the background thread at once, rank 1's held call would
  // read the new state and rank 0's the old one; as a command in the stream it lands after
  // the held call on both.
  constexpr int kRanks = 2, kOps = 400;
  auto hub = makeLoopbackHub(kRanks);
  Failures failures;
  std::vector<std::vector<bool>> calls(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Config c = testConfig(r, kRanks);
        c.pipeline = "1";
        c.shm = false;
        c.autotune = true;
        c.autotune_window_seconds = 0.001;
        c.autotune_warmup_windows = 0;
        c.autotune_samples = 1;
        Runtime rt(c, std::make_unique<RecordingTransport>(makeLoopbackTransport(hub, r),
                                                           &calls[r], r == 1, 2.0));
        const int64_t n = ExecStream::kInlineBytes / 4;
        std::vector<std::vector<float>> data(kOps, std::vector<float>(n, 1.0f));
        std::vector<Handle> handles(kOps);
        for (int i = 0; i < kOps; ++i) {
          Status s = submitOne(rt, makeTestEntry(OpType::kAllreduce, "switch." + std::to_string(i),
                                                 {n}, DataType::kFloat32, data[i].data(),
                                                 data[i].data()),
                               &handles[i]);
          if (!s.ok()) return failures.add("rank " + std::to_string(r) + ": submit: " + s.message());
          // About one round per op (at most 100 ms each), however slow the machine (TSan):
          // autotune needs ~110 rounds to reach the switch.
          const int64_t before = statOf(rt, "rounds.with_work");
          for (int k = 0; k < 1000 && statOf(rt, "rounds.with_work") == before; ++k)
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        for (int i = 0; i < kOps; ++i) {
          Status s = rt.wait(handles[i], 30, nullptr);
          if (!s.ok()) return failures.add("rank " + std::to_string(r) + ": wait: " + s.message());
          if (data[i][0] != kRanks)
            failures.add("rank " + std::to_string(r) + ": op " + std::to_string(i) + " summed to " +
                         std::to_string(data[i][0]));
        }
        rt.shutdown();
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures.summary() == "0 failure(s)");
  INFO("allreduce calls: " << calls[0].size() << " on rank 0, " << calls[1].size() << " on rank 1");
  REQUIRE(calls[0].size() == calls[1].size());
  size_t first_on = calls[0].size();
  for (size_t i = 0; i < calls[0].size(); ++i) {
    INFO("call " << i);
    REQUIRE(calls[0][i] == calls[1][i]);
    if (calls[0][i] && first_on == calls[0].size()) first_on = i;
  }
  // The switch did flip during the run (else the test shows nothing).
  CHECK(first_on > 0);
  CHECK(first_on < calls[0].size());
}

TEST_CASE("a large allgather or alltoall with pipelined rounds runs on the stream's thread, a small op inline") {
  // Callbacks run on the thread that ran the op. The first op, small and with the stream
  // idle, runs inline on the background thread; an allgather or alltoall of 64 KiB or more
  // counts its bytes and goes to the stream's thread (counted as 0 bytes it ran inline).
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::mutex mu;
    std::vector<std::thread::id> threads;
    auto record = [&](Handle, const Status&) {
      std::lock_guard<std::mutex> lock(mu);
      threads.push_back(std::this_thread::get_id());
    };
    auto runWithCallback = [&](TensorEntry e, const std::string& what) {
      std::vector<TensorEntry> entries;
      entries.push_back(std::move(e));
      Handle h = 0;
      c.expectOk(c.rt.submit(0, std::move(entries), record, &h), "submit " + what);
      Result result;
      c.expectOk(c.rt.wait(h, 30, &result), "wait " + what);
      std::free(result.data);
    };
    std::vector<float> small(4, 1.0f);
    runWithCallback(makeTestEntry(OpType::kAllreduce, "small", {4}, DataType::kFloat32,
                                  small.data(), small.data()), "small");
    const int64_t rows = ExecStream::kInlineBytes / 4 / 2;  // each rank half of 64 KiB
    std::vector<float> mine(rows, float(c.rank));
    runWithCallback(makeTestEntry(OpType::kAllgather, "gathered", {rows}, DataType::kFloat32,
                                  mine.data(), nullptr), "allgather");
    TensorEntry e = makeTestEntry(OpType::kAlltoall, "exchanged", {2 * rows}, DataType::kFloat32,
                                  nullptr, nullptr);
    std::vector<float> send(2 * rows, float(c.rank));
    e.input = send.data();
    e.request.splits = {rows, rows};
    runWithCallback(std::move(e), "alltoall");
    std::lock_guard<std::mutex> lock(mu);
    if (threads.size() != 3) return c.fail(std::to_string(threads.size()) + " callbacks, not 3");
    if (threads[1] == threads[0]) c.fail("the allgather ran inline, as the small allreduce");
    if (threads[2] == threads[0]) c.fail("the alltoall ran inline, as the small allreduce");
  }, failures, [](Config& config) {
    config.pipeline = "1";
    config.shm = false;
  });
  CHECK(failures.summary() == "0 failure(s)");
}

}  // namespace test
}  // namespace tutti
