// Loopback backend data plane, threads as ranks: every op × dtype × reduce op over world
// sizes {1,2,3,4,5,8} and counts {0, 1, n-1, n+1, large}, against independent references.
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

const std::vector<int> kWorldSizes = {1, 2, 3, 4, 5, 8};
const std::vector<int64_t> kCounts = {0, 1, 16, 18};  // 0, 1, n-1, n+1 around 17

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

std::string caseName(const char* op, int n, int64_t count) {
  return std::string(op) + " n=" + std::to_string(n) + " count=" + std::to_string(count);
}

TEST_CASE("loopback allreduce: every dtype, reduce op, world size, count, in place or not") {
  for (int n : kWorldSizes) {
    Failures failures;
    runRanks(n, failures, [&](int rank, Backend& backend) {
      if (backend.rank() != rank || backend.size() != n) failures.add("wrong rank/size");
      int salt = 0;
      for (int64_t count : kCounts)
        for (DataType dtype : allDataTypes())
          for (ReduceOp op : allReduceOps()) {
            ++salt;
            auto in = makeInput(dtype, op, rank, n, count, salt);
            bool in_place = salt % 2 == 0;
            std::vector<uint8_t> out(in.size(), 0xEE);
            void* dst = in_place ? in.data() : out.data();
            backend.allreduce(in.data(), dst, count, dtype, op, deadlineAfter(30));
            checkReduced(failures, caseName("allreduce", n, count), dtype, op, n, dst, 0, count,
                         salt);
            if (!in_place && in != makeInput(dtype, op, rank, n, count, salt))
              failures.add(caseName("allreduce", n, count) + ": input was modified");
          }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("loopback reducescatter: uneven blocks incl. empty ones") {
  for (int n : kWorldSizes) {
    Failures failures;
    runRanks(n, failures, [&](int rank, Backend& backend) {
      int salt = 0;
      for (int64_t base : kCounts)
        for (DataType dtype : allDataTypes())
          for (ReduceOp op : allReduceOps()) {
            ++salt;
            std::vector<int64_t> counts(n);
            for (int r = 0; r < n; ++r) counts[r] = (base + r * (salt % 3)) % (base + 2);
            int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
            int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
            auto in = makeInput(dtype, op, rank, n, total, salt);
            std::vector<uint8_t> out((counts[rank] + 1) * dataTypeSize(dtype), 0xEE);
            bool in_place = salt % 2 == 0;  // out = start of in
            void* dst = in_place ? in.data() : out.data();
            backend.reducescatter(in.data(), dst, counts, dtype, op, deadlineAfter(30));
            checkReduced(failures, caseName("reducescatter", n, base), dtype, op, n, dst, offset,
                         counts[rank], salt);
          }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("loopback allgatherv, broadcast, alltoallv move every member's bytes") {
  for (int n : kWorldSizes) {
    Failures failures;
    runRanks(n, failures, [&](int rank, Backend& backend) {
      int salt = 0;
      for (int64_t base : kCounts)
        for (DataType dtype : allDataTypes()) {
          ++salt;
          const int64_t esz = dataTypeSize(dtype);
          std::string what = caseName("", n, base) + " " + dataTypeName(dtype);
          // allgatherv: member r contributes (base + r) % (base + 2) elements (some zero).
          std::vector<int64_t> counts(n);
          for (int r = 0; r < n; ++r) counts[r] = (base + r * salt) % (base + 2);
          int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
          std::vector<uint8_t> mine(counts[rank] * esz + 1);
          for (int64_t b = 0; b < counts[rank] * esz; ++b)
            mine[b] = patternByte(dtype, rank, b, salt);
          std::vector<uint8_t> gathered(total * esz + 1, 0xEE);
          backend.allgatherv(mine.data(), gathered.data(), counts, dtype, deadlineAfter(30));
          for (int r = 0, off = 0; r < n; off += counts[r] * esz, ++r)
            for (int64_t b = 0; b < counts[r] * esz; ++b)
              if (gathered[off + b] != patternByte(dtype, r, b, salt)) {
                failures.add("allgatherv" + what + ": block of rank " + std::to_string(r) +
                             " wrong at byte " + std::to_string(b));
                break;
              }
          checkBroadcastFromEveryRoot(backend, rank, n, base, dtype, salt, what, failures,
                                      deadlineAfter(30));
          checkAlltoallv(backend, rank, n, base, dtype, salt, what, failures, deadlineAfter(30));
        }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("loopback large counts (about 1M elements)") {
  const int n = 4;
  const int64_t count = (1 << 20) + 1;
  Failures failures;
  runRanks(n, failures, [&](int rank, Backend& backend) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      auto in = makeInput(dtype, ReduceOp::kSum, rank, n, count, 3);
      backend.allreduce(in.data(), in.data(), count, dtype, ReduceOp::kSum, deadlineAfter(60));
      checkReduced(failures, "large allreduce", dtype, ReduceOp::kSum, n, in.data(), 0, count, 3);
    }
    std::vector<int64_t> counts = {count / 4, count / 4 + 1, 0, count - count / 2 - 1};
    auto in = makeInput(DataType::kInt32, ReduceOp::kMax, rank, n, count, 5);
    std::vector<int32_t> out(counts[rank] + 1);
    backend.reducescatter(in.data(), out.data(), counts, DataType::kInt32, ReduceOp::kMax,
                          deadlineAfter(60));
    int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
    checkReduced(failures, "large reducescatter", DataType::kInt32, ReduceOp::kMax, n,
                 out.data(), offset, counts[rank], 5);
    std::vector<int32_t> mine(counts[rank] + 1, rank + 1), all(count);
    backend.allgatherv(mine.data(), all.data(), counts, DataType::kInt32, deadlineAfter(60));
    for (int r = 0, off = 0; r < n; off += counts[r], ++r)
      for (int64_t i = 0; i < counts[r]; ++i)
        if (all[off + i] != r + 1) {
          failures.add("large allgatherv: block " + std::to_string(r) + " wrong");
          break;
        }
  });
  REQUIRE(failures.summary() == "0 failure(s)");
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
