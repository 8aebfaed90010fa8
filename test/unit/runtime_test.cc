// The runtime end to end with threads as ranks: negotiation, ordering, errors, lifecycle.
#include "test/unit/rank_threads.h"

#include "test/catch.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>

using namespace tutti;
using namespace tutti::test;

TEST_CASE("allreduce of every dtype and reduce op at world sizes 1-5 and odd counts") {
  for (int n : {1, 2, 3, 4, 5}) {
    Failures failures;
    runRanks(n, [](RankContext& c) {
      int salt = 0;
      for (DataType dtype : allDataTypes()) {
        for (ReduceOp op : allReduceOps()) {
          for (int64_t count : {0, 1, 6, 7, 129}) {
            ++salt;
            auto in = makeInput(dtype, op, c.rank, c.size, count, salt);
            std::vector<uint8_t> out(in.size());
            bool in_place = salt % 2 == 0;
            TensorEntry e = makeTestEntry(OpType::kAllreduce, "t" + std::to_string(salt), {count},
                                          dtype, in.data(), in_place ? in.data() : out.data());
            e.request.reduce_op = op;
            Status s = runOne(c.rt, std::move(e));
            c.expectOk(s, "allreduce");
            checkReduced(c.failures, "n=" + std::to_string(c.size) + " count=" + std::to_string(count),
                         dtype, op, c.size, in_place ? in.data() : out.data(), 0, count, salt);
          }
        }
      }
    }, failures);
    INFO("world size " << n);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("average, prescale and postscale") {
  Failures failures;
  runRanks(3, [](RankContext& c) {
    std::vector<float> x(5, static_cast<float>(c.rank + 1)), y(5);
    TensorEntry e = makeTestEntry(OpType::kAllreduce, "avg", {5}, DataType::kFloat32, x.data(), y.data());
    e.request.reduce_op = ReduceOp::kAverage;
    e.request.prescale = 2.0;
    e.request.postscale = 0.5;
    c.expectOk(runOne(c.rt, std::move(e)), "average");
    if (y[4] != 2.0f) c.fail("average: expected 2, got " + std::to_string(y[4]));  // (2+4+6)/3*0.5
    std::vector<int32_t> i(3, c.rank == 0 ? 7 : 0);
    TensorEntry ei = makeTestEntry(OpType::kAllreduce, "iavg", {3}, DataType::kInt32, i.data(), i.data());
    ei.request.reduce_op = ReduceOp::kAverage;
    c.expectOk(runOne(c.rt, std::move(ei)), "int average");
    if (i[0] != 2) c.fail("int average: expected 7/3 -> 2, got " + std::to_string(i[0]));
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("tensors submitted in a different order on each rank all complete, fused") {
  for (int n : {2, 3, 4}) {
    Failures failures;
    runRanks(n, [](RankContext& c) {
     for (int step = 0; step < 3; ++step) {  // steps 2 and 3 hit the response cache
      const int kTensors = 64;
      std::vector<std::vector<float>> data(kTensors);
      std::vector<Handle> handles(kTensors);
      for (int k = 0; k < kTensors; ++k) {
        int t = (k + c.rank * 17) % kTensors;  // rotated order per rank
        data[t].assign(t + 1, static_cast<float>(c.rank + t));
        Status s = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "grad." + std::to_string(t),
                                                 {t + 1}, DataType::kFloat32, data[t].data(), data[t].data()),
                             &handles[t]);
        c.expectOk(s, "submit");
      }
      for (int t = 0; t < kTensors; ++t) {
        c.expectOk(c.rt.wait(handles[t], 30, nullptr), "wait " + std::to_string(t));
        float expected = static_cast<float>(c.size * t + c.size * (c.size - 1) / 2);
        if (data[t][t] != expected)
          c.fail("grad." + std::to_string(t) + ": expected " + std::to_string(expected) + " got " +
                 std::to_string(data[t][t]));
      }
     }
    }, failures);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("a mismatch fails on every rank with the same message and the next op still works") {
  Failures failures;
  std::vector<std::string> messages(3);
  runRanks(3, [&](RankContext& c) {
    std::vector<float> x(12, 1.0f);
    std::vector<int64_t> shape = c.rank == 1 ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4};
    Status s = runOne(c.rt, makeTestEntry(OpType::kAllreduce, "grad/w1", shape, DataType::kFloat32, x.data(), x.data()));
    if (s.code() != StatusCode::kMismatch) c.fail("expected a mismatch, got: " + s.message());
    messages[c.rank] = s.message();
    c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "grad/w1", {12}, DataType::kFloat32, x.data(), x.data())),
               "next op");
    if (x[0] != 3.0f) c.fail("next op result " + std::to_string(x[0]));
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
  CHECK(messages[0] == "allreduce 'grad/w1': shape [3,4] on rank 0 but [4,3] on rank 1");
  CHECK(messages[1] == messages[0]);
  CHECK(messages[2] == messages[0]);
}

TEST_CASE("a duplicate name in flight is refused on that rank only") {
  Failures failures;
  std::atomic<bool> tried{false};
  runRanks(2, [&tried](RankContext& c) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    Handle h1 = 0, h2 = 0;
    if (c.rank == 0) {
      c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "dup", {4}, DataType::kFloat32, a.data(), a.data()), &h1), "first");
      Status s = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "dup", {4}, DataType::kFloat32, b.data(), b.data()), &h2);
      if (s.code() != StatusCode::kDuplicateName) c.fail("expected duplicate name, got: " + s.message());
      tried = true;
      c.expectOk(c.rt.wait(h1, 30, nullptr), "wait first");
    } else {
      // Only after rank 0's second try: before, the first "dup" could already have run.
      for (int k = 0; k < 10000 && !tried.load(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "dup", {4}, DataType::kFloat32, a.data(), a.data())), "other rank");
    }
    if (a[0] != 2.0f) c.fail("result " + std::to_string(a[0]));
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("bad input is refused at submit with a clear message") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::vector<float> x(4);
    TensorEntry bad_root = makeTestEntry(OpType::kBroadcast, "b", {4}, DataType::kFloat32, x.data(), x.data());
    bad_root.request.root = 2;
    Handle h;
    Status s = submitOne(c.rt, std::move(bad_root), &h);
    if (s.message() != "broadcast 'b': root 2 is outside the process set (expected 0..1)") c.fail(s.message());
    TensorEntry bad_splits = makeTestEntry(OpType::kAlltoall, "a", {4}, DataType::kFloat32, x.data(), nullptr);
    bad_splits.request.splits = {1, 2};
    s = submitOne(c.rt, std::move(bad_splits), &h);
    if (s.message() != "alltoall 'a': splits sum to 3 but the first dimension is 4") c.fail(s.message());
    s = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "n", {4}, DataType::kFloat32, nullptr, x.data()), &h);
    if (s.code() != StatusCode::kInvalidArgument) c.fail("null input accepted");
    s = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "n", {4}, DataType::kFloat32, x.data(), x.data()), &h, 7);
    if (s.message() != "allreduce 'n': process set 7 does not exist") c.fail(s.message());
    c.expectOk(c.rt.wait(0, 0, nullptr).code() == StatusCode::kInvalidArgument ? Status() : Status(StatusCode::kInternal, "handle 0 accepted"), "handle 0");
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("wait with a short timeout keeps the handle; one rank's shutdown stops every rank") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::vector<float> x(4, 1.0f);
    if (c.rank == 0) {
      Handle h;
      c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "late", {4}, DataType::kFloat32, x.data(), x.data()), &h), "submit");
      Status s = c.rt.wait(h, 0.05, nullptr);
      if (s.code() != StatusCode::kInProgress) c.fail("expected in progress, got " + s.message());
      c.expectOk(c.rt.wait(h, 30, nullptr), "wait after in-progress");
      c.rt.shutdown();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "late", {4}, DataType::kFloat32, x.data(), x.data())), "late");
      // Rank 0 shuts down: this rank's runtime stops with a clear, sticky status.
      waitUntilStopped(c.rt, 10);
      Status s = runOne(c.rt, makeTestEntry(OpType::kAllreduce, "after", {4}, DataType::kFloat32, x.data(), x.data()));
      if (s.message() != "Tutti was shut down: rank 0 called shutdown") c.fail("after shutdown: " + s.message());
    }
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("the response cache: repeats, a changed shape under a cached name, eviction") {
  for (int64_t capacity : {0, 2, 1024}) {
    Failures failures;
    runRanks(3, [](RankContext& c) {
      for (int step = 0; step < 30; ++step) {
        // Five names cycling through a cache of two slots: hits, misses and evictions.
        std::string name = "w" + std::to_string(step % 5);
        std::vector<float> x(4 + step % 5, static_cast<float>(c.rank + step));
        c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, name, {static_cast<int64_t>(x.size())},
                                              DataType::kFloat32, x.data(), x.data())), name);
        float expected = static_cast<float>(3 * step + 3);
        if (x.back() != expected) c.fail(name + " step " + std::to_string(step) + ": " + std::to_string(x.back()));
      }
      // Same name, a different shape on one rank: an error, not a hang on a stale hit.
      std::vector<float> y(6, 1.0f);
      int64_t n = c.rank == 2 ? 5 : 4;
      Status s = runOne(c.rt, makeTestEntry(OpType::kAllreduce, "w0", {n}, DataType::kFloat32, y.data(), y.data()));
      if (s.code() != StatusCode::kMismatch) c.fail("changed shape under a cached name: " + s.message());
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "w0", {4}, DataType::kFloat32, y.data(), y.data())), "w0 again");
      if (y[0] != 3.0f) c.fail("w0 again: " + std::to_string(y[0]));
    }, failures, [capacity](Config& config) { config.cache_capacity = capacity; });
    INFO("cache capacity " << capacity);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("a cached op one rank submits late still completes (its hit waits, then negotiates)") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    for (int step = 0; step < 3; ++step) {
      if (c.rank == 1 && step == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      std::vector<int64_t> x(3, c.rank + 1);
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "late.cached", {3}, DataType::kInt64, x.data(), x.data())), "late");
      if (x[2] != 3) c.fail("step " + std::to_string(step) + ": " + std::to_string(x[2]));
    }
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("a stalled tensor stops the job on every rank with a message naming it and the missing rank") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::vector<float> x(2, 1.0f);
    Status s;
    if (c.rank == 0) {
      s = runOne(c.rt, makeTestEntry(OpType::kAllreduce, "only.rank0", {2}, DataType::kFloat32, x.data(), x.data()));
    } else {
      s = waitUntilStopped(c.rt, 20);
    }
    if (s.code() != StatusCode::kTimeout) c.fail("expected a timeout, got: " + s.message());
    if (s.message().find("stall shutdown: allreduce 'only.rank0' (process set 0) has waited") == std::string::npos ||
        s.message().find("for rank(s) 1") == std::string::npos)
      c.fail("message: " + s.message());
    // Sticky: every later call reports the same error.
    Handle h;
    Status later = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "later", {2}, DataType::kFloat32, x.data(), x.data()), &h);
    if (later.message() != s.message()) c.fail("not sticky: " + later.message());
  }, failures, [](Config& config) {
    config.stall_check_disable = false;
    config.stall_check_seconds = 0.2;
    config.stall_shutdown_seconds = 0.5;
  });
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("a tensor a rank never submits fails on every rank at TUTTI_TIMEOUT_SECONDS, naming the op, tensor, set and missing rank") {
  Failures failures;
  runRanks(3, [](RankContext& c) {
    std::vector<float> x(2, 1.0f);
    const auto start = Clock::now();
    Status s;
    if (c.rank != 2) {
      s = runOne(c.rt, makeTestEntry(OpType::kAllreduce, "never.arrives", {2}, DataType::kFloat32, x.data(), x.data()));
    } else {
      s = waitUntilStopped(c.rt, 20);
    }
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (s.code() != StatusCode::kTimeout) c.fail("expected a timeout, got: " + s.message());
    for (const char* part : {"allreduce 'never.arrives' (process set 0)", "rank(s) 2", "TUTTI_TIMEOUT_SECONDS=1"})
      if (s.message().find(part) == std::string::npos) c.fail("'" + std::string(part) + "' missing in: " + s.message());
    if (took > 6) c.fail("took " + std::to_string(took) + " s");
  }, failures, [](Config& config) { config.timeout_seconds = 1; });
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("handles used only with callbacks are released, the oldest first, and a callback may shut down") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::vector<float> x(1, 1.0f);
    std::atomic<size_t> calls{0};
    const size_t n = HandleTable::kKeepCalledBack + 8;
    Handle first = 0, last = 0;
    for (size_t i = 0; i < n; ++i) {
      std::vector<TensorEntry> entries;
      entries.push_back(makeTestEntry(OpType::kAllreduce, "cb." + std::to_string(i), {1}, DataType::kFloat32, x.data(), x.data()));
      Handle h = 0;
      c.expectOk(c.rt.submit(0, std::move(entries), [&calls](Handle, const Status&) { ++calls; }, &h), "submit");
      if (i == 0) first = h;
      last = h;
      if (i % 64 == 63)  // a bounded number in flight
        for (int k = 0; k < 3000 && calls.load() + 8 < i; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int k = 0; k < 10000 && calls.load() < n; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (calls.load() != n) c.fail("callbacks: " + std::to_string(calls.load()));
    bool done = false;
    if (c.rt.poll(first, &done).code() != StatusCode::kInvalidArgument) c.fail("the oldest callback handle is still known");
    if (!c.rt.poll(last, &done).ok() || !done) c.fail("the newest callback handle is gone or not done");
    // A callback that shuts down runs on the background thread, which must not join itself.
    std::vector<TensorEntry> entries;
    entries.push_back(makeTestEntry(OpType::kAllreduce, "cb.shutdown", {1}, DataType::kFloat32, x.data(), x.data()));
    Handle h = 0;
    Runtime* rt = &c.rt;
    c.expectOk(c.rt.submit(0, std::move(entries), [rt](Handle, const Status&) { rt->shutdown(); }, &h), "submit");
    if (waitUntilStopped(c.rt, 10).ok()) c.fail("a callback's shutdown did not stop the runtime");
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("pipelined rounds: the next round negotiates while a plan runs; TUTTI_PIPELINE=0 takes turns") {
  for (bool pipeline : {true, false}) {
    INFO("TUTTI_PIPELINE=" << pipeline);
    Failures failures;
    std::atomic<int> overlapped{0};
    runRanks(2, [&overlapped](RankContext& c) {
      // A is large enough to go to the executor thread (a small plan runs inline when it idles).
      std::vector<float> a(ExecStream::kInlineBytes / 4 + 1, 1.0f), b(4, 2.0f);
      std::atomic<bool> release{false}, in_callback{false};
      // A's callback holds the thread that runs plans until released (at most 3 s).
      std::vector<TensorEntry> entries;
      entries.push_back(makeTestEntry(OpType::kAllreduce, "pipe.a", {int64_t(a.size())}, DataType::kFloat32, a.data(), a.data()));
      Handle ha = 0, hb = 0;
      c.expectOk(c.rt.submit(0, std::move(entries), [&](Handle, const Status&) {
        in_callback = true;
        for (int k = 0; k < 3000 && !release.load(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }, &ha), "submit a");
      for (int k = 0; k < 10000 && !in_callback.load(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const int64_t before = statOf(c.rt, "rounds.with_work");
      c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "pipe.b", {4}, DataType::kFloat32, b.data(), b.data()), &hb), "submit b");
      // B's round (negotiation, a round with work) runs while A's callback still holds the
      // executor thread; with TUTTI_PIPELINE=0 the background thread is the one held.
      bool negotiated = false;
      for (int k = 0; k < 1000 && !negotiated; ++k) {
        negotiated = statOf(c.rt, "rounds.with_work") > before;
        if (!negotiated) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (negotiated && !release.load()) ++overlapped;
      release = true;
      c.expectOk(c.rt.wait(ha, 10, nullptr), "wait a");
      c.expectOk(c.rt.wait(hb, 10, nullptr), "wait b");
      if (a[0] != 2.0f || a.back() != 2.0f || b[3] != 4.0f) c.fail("wrong sums: " + std::to_string(a[0]) + ", " + std::to_string(b[3]));
    }, failures, [pipeline](Config& config) { config.pipeline = pipeline ? "1" : "0"; });
    CHECK(failures.summary() == "0 failure(s)");
    CHECK(overlapped.load() == (pipeline ? 2 : 0));
  }
}

TEST_CASE("a caller waiting on its op runs the rounds itself, beside other waiting threads and callbacks") {
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    Failures failures;
    runRanks(n, [](RankContext& c) {
      const float n = static_cast<float>(c.size);
      // 1. Lone ops waited on at once (no timeout of their own): the caller runs the round.
      std::vector<float> x(3);
      for (int i = 0; i < 200; ++i) {
        std::fill(x.begin(), x.end(), static_cast<float>(c.rank + i));
        Handle h = 0;
        c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "lone", {3}, DataType::kFloat32, x.data(), x.data()), &h), "submit lone");
        c.expectOk(c.rt.wait(h, -1, nullptr), "wait lone");
        const float want = n * i + n * (n - 1) / 2;
        if (x[0] != want || x[2] != want) c.fail("lone " + std::to_string(i) + ": " + std::to_string(x[0]) + ", expected " + std::to_string(want));
      }
      if (statOf(c.rt, "rounds.by_caller") < 1) c.fail("no round was run by the waiting caller");
      // 2. Four threads submitting and waiting at once, and ops completed by callbacks only:
      //    whichever thread runs a round completes the others' ops too.
      std::atomic<int> called{0};
      std::vector<std::vector<float>> cb(16, std::vector<float>(5, 1.0f));
      for (int k = 0; k < 16; ++k) {
        std::vector<TensorEntry> entries;
        entries.push_back(makeTestEntry(OpType::kAllreduce, "cb." + std::to_string(k), {5}, DataType::kFloat32, cb[k].data(), cb[k].data()));
        Handle h = 0;
        c.expectOk(c.rt.submit(0, std::move(entries), [&called](Handle, const Status& s) { if (s.ok()) ++called; }, &h), "submit cb");
      }
      std::vector<std::thread> waiters;
      for (int t = 0; t < 4; ++t) {
        waiters.emplace_back([&c, t, n] {
          std::vector<float> y(7);
          for (int i = 0; i < 50; ++i) {
            std::fill(y.begin(), y.end(), static_cast<float>(t + i));
            Handle h = 0;
            const std::string name = "thread" + std::to_string(t) + "." + std::to_string(i);
            c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, name, {7}, DataType::kFloat32, y.data(), y.data()), &h), "submit " + name);
            c.expectOk(c.rt.wait(h, -1, nullptr), "wait " + name);
            if (y[6] != n * (t + i)) c.fail(name + ": " + std::to_string(y[6]));
          }
        });
      }
      for (auto& w : waiters) w.join();
      for (int k = 0; k < 10000 && called.load() < 16; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (called.load() != 16) c.fail("callbacks: " + std::to_string(called.load()) + " of 16");
      for (const auto& v : cb)
        if (v[4] != n) c.fail("callback op: " + std::to_string(v[4]));
    }, failures);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("a waiting caller's rounds end cleanly: another rank's shutdown, and a callback that shuts down") {
  Failures failures;
  runRanks(2, [](RankContext& c) {
    std::vector<float> x(4, 1.0f);
    if (c.rank == 0) {
      // Waits (running rounds) on an op rank 1 never submits, until rank 1 shuts down.
      Handle h = 0;
      c.expectOk(submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "never", {4}, DataType::kFloat32, x.data(), x.data()), &h), "submit");
      const auto start = Clock::now();
      Status s = c.rt.wait(h, -1, nullptr);
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      if (s.message() != "allreduce 'never' (process set 0): Tutti was shut down: rank 1 called shutdown")
        c.fail("wait: " + s.message());
      if (took > 10) c.fail("the wait took " + std::to_string(took) + " s");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c.rt.shutdown();
    }
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
  Failures failures2;
  runRanks(2, [](RankContext& c) {
    // The op's callback runs on the caller that ran its round, and asks for the stop there.
    std::vector<float> x(4, 1.0f);
    Runtime* rt = &c.rt;
    std::vector<TensorEntry> entries;
    entries.push_back(makeTestEntry(OpType::kAllreduce, "stop", {4}, DataType::kFloat32, x.data(), x.data()));
    Handle h = 0;
    c.expectOk(c.rt.submit(0, std::move(entries), [rt](Handle, const Status&) { rt->shutdown(); }, &h), "submit");
    c.expectOk(c.rt.wait(h, -1, nullptr), "wait");
    if (waitUntilStopped(c.rt, 10).ok()) c.fail("the callback's shutdown did not stop the runtime");
  }, failures2);
  CHECK(failures2.summary() == "0 failure(s)");
}
