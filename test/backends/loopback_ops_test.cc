// Loopback backend data plane, threads as ranks: the barrier and supports(); every op x
// dtype x reduce op x count is the conformance suite's (test/conformance).
#include "backends/loopback/loopback.h"
#include "test/backends/backend_test_util.h"

#include "test/catch.h"

#include <atomic>
#include <exception>
#include <functional>
#include <numeric>
#include <thread>

namespace tutti {
namespace test {
namespace {

// Runs fn(rank, backend) on `n` threads over one hub; exceptions become failures.
void runRanks(int n, Failures& failures, const std::function<void(int, Backend&)>& fn) {
  auto hub = makeLoopbackHub(n);
  std::vector<int> world(n);
  std::iota(world.begin(), world.end(), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto transport = makeLoopbackTransport(hub, r);
        auto backend = transport->makeBackend(world, 0);
        fn(r, *backend);
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
}

TEST_CASE("loopback barrier waits for the last member") {
  for (int n : {1, 2, 3, 5}) {
    Failures failures;
    std::atomic<int> before{0};
    runRanks(n, failures, [&](int rank, Backend& backend) {
      for (int round = 0; round < 20; ++round) {
        if (rank == n - 1 && round % 5 == 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ++before;
        backend.barrier(deadlineAfter(30));
        // Everyone has arrived at this round's barrier; nobody can be past the next one.
        int seen = before.load();
        if (seen != n * (round + 1))
          failures.add("barrier round " + std::to_string(round) + ": saw " +
                       std::to_string(seen) + " arrivals");
        backend.barrier(deadlineAfter(30));
      }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("loopback supports every CPU op and dtype, no CUDA") {
  auto hub = makeLoopbackHub(1);
  auto backend = makeLoopbackTransport(hub, 0)->makeBackend({0}, 0);
  CHECK(std::string(backend->name()) == "loopback");
  for (int op = 0; op < kNumOpTypes; ++op)
    for (DataType dtype : allDataTypes()) {
      CHECK(backend->supports(static_cast<OpType>(op), dtype, DeviceType::kCpu));
      CHECK_FALSE(backend->supports(static_cast<OpType>(op), dtype, DeviceType::kCuda));
    }
}

}  // namespace
}  // namespace test
}  // namespace tutti
