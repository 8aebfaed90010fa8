// Loopback control plane, process sets used concurrently, timeouts, abort and argument
// errors, threads as ranks.
#include "backends/loopback/loopback.h"
#include "test/backends/backend_test_util.h"

#include "test/catch.h"

#include <atomic>
#include <functional>
#include <numeric>
#include <thread>

namespace tutti {
namespace test {
namespace {

std::vector<int> worldRanks(int n) {
  std::vector<int> ranks(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

TEST_CASE("loopback control plane: gather, broadcast, allreduceAnd") {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    auto hub = makeLoopbackHub(n);
    Failures failures;
    runThreads(n, failures, [&](int rank) {
      auto control = makeLoopbackTransport(hub, rank)->makeControlPlane(worldRanks(n), 0);
      if (control->rank() != rank || control->size() != n) failures.add("wrong rank/size");
      for (int round = 0; round < 5; ++round) {
        // Lengths differ per rank and include the empty string.
        std::string mine((rank * 3 + round) % 5, static_cast<char>('a' + rank));
        auto all = control->gather(mine, deadlineAfter(30));
        if (rank != 0 && !all.empty()) failures.add("gather: non-root got data");
        if (rank == 0) {
          if (static_cast<int>(all.size()) != n) failures.add("gather: wrong size");
          for (int r = 0; r < n && r < static_cast<int>(all.size()); ++r)
            if (all[r] != std::string((r * 3 + round) % 5, static_cast<char>('a' + r)))
              failures.add("gather: wrong bytes from rank " + std::to_string(r));
        }
        std::string sent = rank == 0 ? std::string(1000 + round, 'x') + char(round) : "ignored";
        std::string got = control->broadcast(sent, deadlineAfter(30));
        if (got != std::string(1000 + round, 'x') + char(round))
          failures.add("broadcast: wrong bytes on rank " + std::to_string(rank));
        // Word w has bit b cleared by rank (w * 64 + b) % (n + 1) (so rank n clears none).
        std::vector<uint64_t> bits(3 + round, ~uint64_t{0});
        for (size_t w = 0; w < bits.size(); ++w)
          for (int b = 0; b < 64; ++b)
            if (static_cast<int>((w * 64 + b) % (n + 1)) == rank) bits[w] &= ~(uint64_t{1} << b);
        control->allreduceAnd(bits, deadlineAfter(30));
        for (size_t w = 0; w < bits.size(); ++w) {
          uint64_t expected = ~uint64_t{0};
          for (int b = 0; b < 64; ++b)
            if (static_cast<int>((w * 64 + b) % (n + 1)) < n) expected &= ~(uint64_t{1} << b);
          if (bits[w] != expected) failures.add("allreduceAnd: word " + std::to_string(w));
        }
      }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("loopback process sets run concurrently without interfering") {
  // World of 6; each rank runs three threads at once: the world group (id 0), its parity
  // group (ids 1, 2) and a group of ranks {1, 2, 4} (id 3) for members, each with its own
  // data plane and control plane, 30 rounds each.
  const int n = 6;
  auto hub = makeLoopbackHub(n);
  std::vector<std::vector<int>> groups = {worldRanks(n), {0, 2, 4}, {1, 3, 5}, {1, 2, 4}};
  Failures failures;
  runThreads(n * 4, failures, [&](int thread) {
    int rank = thread / 4, id = thread % 4;
    const auto& ranks = groups[id];
    if (!std::binary_search(ranks.begin(), ranks.end(), rank)) return;
    auto transport = makeLoopbackTransport(hub, rank);
    auto backend = transport->makeBackend(ranks, id);
    auto control = transport->makeControlPlane(ranks, id);
    int size = static_cast<int>(ranks.size()), member = backend->rank();
    for (int round = 0; round < 30; ++round) {
      int64_t count = 7 + round;
      auto in = makeInput(DataType::kInt64, ReduceOp::kSum, member, size, count, round + id);
      backend->allreduce(in.data(), in.data(), count, DataType::kInt64, ReduceOp::kSum,
                         deadlineAfter(30));
      checkReduced(failures, "group " + std::to_string(id), DataType::kInt64, ReduceOp::kSum,
                   size, in.data(), 0, count, round + id);
      std::string got = control->broadcast(member == 0 ? std::to_string(id * 100 + round) : "",
                                           deadlineAfter(30));
      if (got != std::to_string(id * 100 + round))
        failures.add("group " + std::to_string(id) + " broadcast got " + got);
    }
  });
  REQUIRE(failures.summary() == "0 failure(s)");
}

// Runs allreduce on `arriving` ranks of a world of n (group id 7) with a short deadline.
std::vector<std::string> timeoutMessages(int n, const std::vector<int>& arriving,
                                         std::vector<std::unique_ptr<Backend>>& backends) {
  auto hub = makeLoopbackHub(n);
  for (int r = 0; r < n; ++r)
    backends.push_back(makeLoopbackTransport(hub, r)->makeBackend(worldRanks(n), 7));
  std::vector<std::string> messages(n);
  std::vector<std::thread> threads;
  for (int r : arriving)
    threads.emplace_back([&, r] {
      float x = 1;
      try {
        backends[r]->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadlineAfter(0.3));
        messages[r] = "no error";
      } catch (const Error& e) {
        messages[r] = std::string(e.code() == StatusCode::kTimeout ? "timeout: " : "other: ") +
                      e.what();
      }
    });
  for (auto& t : threads) t.join();
  return messages;
}

TEST_CASE("loopback timeout names the missing ranks and poisons the group") {
  std::vector<std::unique_ptr<Backend>> backends;
  auto messages = timeoutMessages(4, {0, 3}, backends);
  for (int r : {0, 3}) {
    INFO(messages[r]);
    CHECK(messages[r].rfind("timeout: ", 0) == 0);
    CHECK(messages[r].find("loopback allreduce on group 7: timed out after 0.3 s waiting for "
                           "rank(s) 1, 2") != std::string::npos);
  }
  // The late rank and every later call fail at once with the same sticky error.
  for (int r : {1, 0}) {
    auto start = Clock::now();
    float x = 1;
    try {
      backends[r]->barrier(deadlineAfter(10));
      FAIL("barrier after a timeout did not throw");
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kTimeout);
      CHECK(std::string(e.what()).find("waiting for rank(s) 1, 2") != std::string::npos);
    }
    CHECK_THROWS_AS(backends[r]->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum,
                                           deadlineAfter(10)),
                    Error);
    CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 1.0);
  }
}

TEST_CASE("loopback timeout with one missing rank in a world of three") {
  std::vector<std::unique_ptr<Backend>> backends;
  auto messages = timeoutMessages(3, {0, 2}, backends);
  INFO(messages[0] << "\n" << messages[2]);
  CHECK(messages[0].find("waiting for rank(s) 1") != std::string::npos);
  CHECK(messages[2].find("waiting for rank(s) 1") != std::string::npos);
  CHECK(messages[0].find("rank(s) 1,") == std::string::npos);
}

TEST_CASE("loopback abort wakes waiting members with the reason") {
  auto hub = makeLoopbackHub(2);
  auto t0 = makeLoopbackTransport(hub, 0), t1 = makeLoopbackTransport(hub, 1);
  auto b0 = t0->makeBackend({0, 1}, 0), b1 = t1->makeBackend({0, 1}, 0);
  auto c1 = t1->makeControlPlane({0, 1}, 0);
  std::string data_error, control_error;
  auto start = Clock::now();
  std::thread waiter([&] {
    try {
      b1->barrier(deadlineAfter(20));
    } catch (const Error& e) {
      data_error = std::to_string(int(e.code())) + " " + e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b0->abort("rank 0 shut down: test abort");
  waiter.join();
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5.0);
  CHECK(data_error == std::to_string(int(StatusCode::kAborted)) + " rank 0 shut down: test abort");
  try {
    c1->gather("x", deadlineAfter(20));
    FAIL("gather after abort did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kAborted);
    CHECK(std::string(e.what()) == "rank 0 shut down: test abort");
  }
  // A different group on the same hub is unaffected.
  auto other = t0->makeBackend({0}, 5);
  int64_t v = 3;
  other->allreduce(&v, &v, 1, DataType::kInt64, ReduceOp::kSum, deadlineAfter(5));
  CHECK(v == 3);
  other->abort("group of one aborted");
  CHECK_THROWS_WITH(
      other->allreduce(&v, &v, 1, DataType::kInt64, ReduceOp::kSum, deadlineAfter(5)),
      "group of one aborted");
}

TEST_CASE("loopback mismatched arguments throw on every member") {
  auto hub = makeLoopbackHub(3);
  std::vector<std::string> messages(3);
  Failures failures;
  runThreads(3, failures, [&](int rank) {
    auto backend = makeLoopbackTransport(hub, rank)->makeBackend(worldRanks(3), 0);
    std::vector<float> buf(8, 1.0f);
    try {
      backend->allreduce(buf.data(), buf.data(), rank == 2 ? 5 : 4, DataType::kFloat32,
                         ReduceOp::kSum, deadlineAfter(10));
    } catch (const Error& e) {
      if (e.code() == StatusCode::kMismatch) messages[rank] = e.what();
    }
    // The group still works afterwards.
    backend->allreduce(buf.data(), buf.data(), 8, DataType::kFloat32, ReduceOp::kSum,
                       deadlineAfter(10));
    if (buf[7] != 3.0f) failures.add("allreduce after mismatch wrong");
  });
  REQUIRE(failures.summary() == "0 failure(s)");
  for (const auto& m : messages) {
    INFO(m);
    CHECK(m.find("members passed different counts: rank 0 passed 4, rank 2 passed 5") !=
          std::string::npos);
  }
}

TEST_CASE("loopback rejects bad groups and ranks") {
  auto hub = makeLoopbackHub(3);
  CHECK_THROWS_AS(makeLoopbackTransport(hub, 3), Error);
  CHECK_THROWS_AS(makeLoopbackHub(0), Error);
  auto t1 = makeLoopbackTransport(hub, 1);
  CHECK(t1->size() == 3);
  CHECK(std::string(t1->name()) == "loopback");
  CHECK_THROWS_WITH(t1->makeBackend({0, 2}, 1), Catch::Contains("not a member"));
  CHECK_THROWS_WITH(t1->makeBackend({1, 0}, 1), Catch::Contains("sorted, distinct"));
  CHECK_THROWS_WITH(t1->makeBackend({1, 3}, 1), Catch::Contains("sorted, distinct"));
  auto held = t1->makeBackend({0, 1}, 4);
  auto t0 = makeLoopbackTransport(hub, 0);
  CHECK_THROWS_WITH(t0->makeBackend({0, 1, 2}, 4), Catch::Contains("members disagree"));
  CHECK_THROWS_AS(held->broadcast(nullptr, 0, DataType::kFloat32, 2, deadlineAfter(1)), Error);
  float x = 0;
  CHECK_THROWS_AS(held->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kAverage,
                                  deadlineAfter(1)),
                  Error);
}

}  // namespace
}  // namespace test
}  // namespace tutti
