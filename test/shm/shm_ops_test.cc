// The shm backend with threads as ranks: one process, so every member maps the same
// segment through its own mapping, and ThreadSanitizer (scripts/sanitize.sh) sees the
// protocol's memory ordering. Barrier, deadlines, abort, the hand-over to the next backend,
// declining, and the shm control plane; every op x dtype x reduce op x count is the
// conformance suite's (test/conformance), with the same 64 KiB buffers.
#include "backends/loopback/loopback.h"
#include "backends/registry.h"
#include "backends/shm/shm_backend.h"
#include "backends/shm/shm_segment.h"
#include "test/backends/backend_test_util.h"
#include "test/shm/shm_test_util.h"

#include "test/catch.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

namespace tutti {
namespace test {
namespace {

detail::ShmOptions smallBuffers() {
  detail::ShmOptions o;
  o.buffer_bytes = 64 << 10;
  o.setup_seconds = 30;
  return o;
}

// Runs fn(rank, backend) on n threads; every member makes its shm backend over a loopback
// control plane. Exceptions become failures.
void runRanks(int n, Failures& failures, const std::function<void(int, Backend&)>& fn,
              const std::function<detail::ShmOptions(int)>& options = nullptr) {
  auto hub = makeLoopbackHub(n);
  std::vector<int> world(n);
  std::iota(world.begin(), world.end(), 0);
  runThreads(n, failures, [&](int r) {
    auto transport = makeLoopbackTransport(hub, r);
    auto control = transport->makeControlPlane(world, 7);
    auto backend = makeShmBackend(*control, world, 7, options ? options(r) : smallBuffers());
    if (!backend) return failures.add("rank " + std::to_string(r) + ": no shm backend");
    fn(r, *backend);
  });
}

TEST_CASE("shm barrier waits for the last member; the segment's name is gone at once") {
  for (int n : {2, 3, 4}) {
    Failures failures;
    std::atomic<int> before{0};
    runRanks(n, failures, [&](int rank, Backend& backend) {
      if (!shmNamesOf(getpid()).empty()) failures.add("segment still named in /dev/shm");
      for (int round = 0; round < 20; ++round) {
        if (rank == n - 1 && round % 5 == 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ++before;
        backend.barrier(deadlineAfter(30));
        if (before.load() != n * (round + 1))
          failures.add("barrier round " + std::to_string(round) + ": saw " +
                       std::to_string(before.load()) + " arrivals");
        backend.barrier(deadlineAfter(30));
      }
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("shm: a member that does not arrive fails the others at the deadline, naming it") {
  Failures failures;
  std::vector<std::string> errors(3);
  runRanks(3, failures, [&](int rank, Backend& backend) {
    float x = 1;
    try {
      if (rank == 2) {  // arrives only after the others gave up; then fails fast (poisoned)
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        auto start = Clock::now();
        try {
          backend.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadlineAfter(30));
        } catch (const Error&) {
          if (Clock::now() - start > std::chrono::seconds(1)) failures.add("poison was slow");
          throw;
        }
      }
      backend.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, deadlineAfter(0.5));
      failures.add("rank " + std::to_string(rank) + ": allreduce returned");
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  REQUIRE(failures.summary() == "0 failure(s)");
  // Rank 0 waits for rank 2 (rank 1 arrived); rank 1 waits for 2 or fails on the poison.
  CHECK_THAT(errors[0], Catch::Contains("shm allreduce on group 7") &&
                            Catch::Contains("timed out after") &&
                            Catch::Contains("waiting for world rank 2 (pid"));
  CHECK_THAT(errors[1], Catch::Contains("world rank 2"));
  CHECK_THAT(errors[2], Catch::Contains("the group was stopped") &&
                            Catch::Contains("waiting for world rank 2"));
}

TEST_CASE("shm buffers by default: 4 MiB a member up to 8 members, 64 MiB a set beyond") {
  using detail::ShmSegment;
  CHECK(ShmSegment::autoBufferBytes(2) == 4 << 20);
  CHECK(ShmSegment::autoBufferBytes(8) == 4 << 20);
  CHECK(ShmSegment::autoBufferBytes(16) == 2 << 20);
  CHECK(ShmSegment::autoBufferBytes(64) == 1 << 20);
  CHECK(ShmSegment::autoBufferBytes(1000) == 1 << 20);
  // Members that leave it to the root get the root's size.
  Failures failures;
  runRanks(3, failures, [&](int, Backend& backend) {
    std::vector<float> x(3 << 20, 1.0f);  // 12 MiB: three 4 MiB chunks
    backend.allreduce(x.data(), x.data(), static_cast<int64_t>(x.size()), DataType::kFloat32,
                      ReduceOp::kSum, deadlineAfter(60));
    if (x.front() != 3.0f || x.back() != 3.0f) failures.add("wrong sum");
  }, [](int) {
    detail::ShmOptions o = smallBuffers();
    o.buffer_bytes = 0;
    return o;
  });
  REQUIRE(failures.summary() == "0 failure(s)");
}

TEST_CASE("shm fused allreduce from pieces: in place, out of place, zeros, dropped, empty, chunked") {
  // Piece k has counts[k] floats; on every rank its input is distinct per element and rank.
  // Piece 1 has no input on rank 0 (a joined rank's zeros), piece 3 no output on rank 1,
  // piece 2 is empty, even pieces are reduced in place. Totals below 16 KiB take the
  // one-round path, the others cross the 64 KiB buffers' chunks mid-piece.
  for (int n : {2, 3, 4}) {  // one member has no shm backend
    for (std::vector<int64_t> counts : {std::vector<int64_t>{1, 7, 0, 1000, 33},
                                        std::vector<int64_t>{5000, 16384, 0, 3, 20001, 1}}) {
      Failures failures;
      const size_t np = counts.size();
      runRanks(n, failures, [&](int rank, Backend& backend) {
        if (!backend.allreducesPieces()) return failures.add("shm says it has no pieces");
        auto value = [&](int r, size_t k, int64_t i) {
          return static_cast<float>((r + 1) * 1000 + static_cast<int64_t>(k) * 100 + i % 97);
        };
        std::vector<std::vector<float>> in(np), out(np);
        std::vector<AllreducePiece> pieces(np);
        int64_t total = 0;
        for (size_t k = 0; k < np; ++k) {
          in[k].resize(static_cast<size_t>(counts[k]));
          out[k].assign(static_cast<size_t>(counts[k]), -1.0f);
          for (int64_t i = 0; i < counts[k]; ++i) in[k][i] = value(rank, k, i);
          pieces[k] = {in[k].data(), k % 2 == 0 ? in[k].data() : out[k].data(), counts[k]};
          if (k == 1 && rank == 0) pieces[k].in = nullptr;
          if (k == 3 && rank == 1) pieces[k].out = nullptr;
          total += counts[k];
        }
        backend.allreducePieces(pieces, total, DataType::kFloat32, ReduceOp::kSum,
                                deadlineAfter(30));
        for (size_t k = 0; k < np; ++k) {
          if (pieces[k].out == nullptr) {
            for (float v : out[k])
              if (v != -1.0f) return failures.add("a dropped piece's memory was written");
            continue;
          }
          const float* got = static_cast<const float*>(pieces[k].out);
          for (int64_t i = 0; i < counts[k]; ++i) {
            float want = 0;
            for (int r = 0; r < n; ++r)
              if (!(k == 1 && r == 0)) want += value(r, k, i);
            if (got[i] != want)
              return failures.add("rank " + std::to_string(rank) + " piece " +
                                  std::to_string(k) + " element " + std::to_string(i) + ": " +
                                  std::to_string(got[i]) + ", expected " +
                                  std::to_string(want));
          }
        }
      });
      INFO("world size " << n << ", " << counts.size() << " pieces, second set: "
                         << (counts.size() == 6));
      REQUIRE(failures.summary() == "0 failure(s)");
    }
  }
}

TEST_CASE("shm abort poisons the segment: every member fails fast with the reason") {
  Failures failures;
  std::vector<std::string> errors(4);
  runRanks(4, failures, [&](int rank, Backend& backend) {
    std::vector<float> x(100000, 1.0f);
    try {
      if (rank == 3) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        backend.abort("test: stopping the job");
      }
      backend.allreduce(x.data(), x.data(), 100000, DataType::kFloat32, ReduceOp::kSum,
                        deadlineAfter(60));
      failures.add("rank " + std::to_string(rank) + ": allreduce returned");
    } catch (const Error& e) {
      errors[rank] = e.what();
      if (e.code() != StatusCode::kAborted) failures.add("wrong code: " + errors[rank]);
    }
  });
  REQUIRE(failures.summary() == "0 failure(s)");
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("test: stopping the job"));
}

TEST_CASE("shm hands broadcasts of the sizes its options name to the next backend") {
  Failures failures;
  auto hub = makeLoopbackHub(2);
  std::vector<int> world = {0, 1};
  runThreads(2, failures, [&](int r) {
    auto transport = makeLoopbackTransport(hub, r);
    auto control = transport->makeControlPlane(world, 9);
    auto next = transport->makeBackend(world, 9);
    detail::ShmOptions o = smallBuffers();
    o.next = next.get();
    o.next_broadcast_from = 1024;
    o.next_broadcast_below = 4096;
    auto shm = makeShmBackend(*control, world, 9, o);
    if (!shm) return failures.add("no shm backend");
    shm->abort("test: shm stopped");  // only the handed-over sizes can still run
    for (int64_t count : {256, 1023}) {
      std::vector<float> x(count, r == 1 ? 5.0f : 0.0f);
      shm->broadcast(x.data(), count, DataType::kFloat32, 1, deadlineAfter(30));
      if (x.front() != 5.0f || x.back() != 5.0f)
        failures.add("broadcast of " + std::to_string(count) + " floats: wrong data");
    }
    std::vector<float> big(1024);
    try {
      shm->broadcast(big.data(), 1024, DataType::kFloat32, 1, deadlineAfter(30));
      failures.add("a 4 KiB broadcast ran on the stopped shm backend");
    } catch (const Error& e) {
      if (e.code() != StatusCode::kAborted) failures.add(e.what());
    }
  });
  REQUIRE(failures.summary() == "0 failure(s)");
}

TEST_CASE("shm declines alike on every member when one sets TUTTI_SHM=0") {
  Failures failures;
  auto hub = makeLoopbackHub(3);
  std::vector<int> world = {0, 1, 2};
  std::vector<std::thread> threads;
  std::atomic<int> got{0};
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto control = makeLoopbackTransport(hub, r)->makeControlPlane(world, 1);
      detail::ShmOptions o = smallBuffers();
      o.enabled = r != 1;
      if (makeShmBackend(*control, world, 1, o)) ++got;
    });
  for (auto& t : threads) t.join();
  CHECK(got.load() == 0);
  CHECK(shmNamesOf(getpid()).empty());
  // A set of one has nothing to share.
  auto alone = makeLoopbackTransport(makeLoopbackHub(1), 0)->makeControlPlane({0}, 2);
  CHECK_FALSE(makeShmBackend(*alone, {0}, 2, smallBuffers()));
}

TEST_CASE("shm control plane: gather, broadcast and AND larger than its buffer, unequal sizes") {
  const int n = 3;
  auto hub = makeLoopbackHub(n);
  std::vector<int> world = {0, 1, 2};
  Failures failures;
  std::vector<std::thread> threads;
  auto message = [](int r, int round) {
    return std::string(static_cast<size_t>(r * 100000 + round * 7), static_cast<char>('a' + r));
  };
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto transport = withShmControlPlanes(makeLoopbackTransport(hub, r), BackendOptions());
        auto control = transport->makeControlPlane(world, 3);
        for (int round = 0; round < 3; ++round) {
          auto all = control->gather(message(r, round), deadlineAfter(30));
          if (r == 0)
            for (int j = 0; j < n; ++j)
              if (all.size() != size_t(n) || all[j] != message(j, round))
                failures.add("gather round " + std::to_string(round) + ": member " +
                             std::to_string(j) + "'s bytes differ");
          std::string b = control->broadcast(r == 0 ? message(2, round) : "x", deadlineAfter(30));
          if (b != message(2, round)) failures.add("broadcast differs on " + std::to_string(r));
          std::vector<uint64_t> bits(20000 + round, ~uint64_t{0});
          for (size_t i = 0; i < bits.size(); ++i)
            if (i % 3 == size_t(r)) bits[i] = ~(uint64_t{1} << (i % 64));
          control->allreduceAnd(bits, deadlineAfter(30));
          for (size_t i = 0; i < bits.size(); ++i)
            if (bits[i] != ~(uint64_t{1} << (i % 64))) {
              failures.add("AND wrong at word " + std::to_string(i));
              break;
            }
          std::vector<uint64_t> none;
          control->allreduceAnd(none, deadlineAfter(30));
        }
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE(failures.summary() == "0 failure(s)");
}

}  // namespace
}  // namespace test
}  // namespace tutti
