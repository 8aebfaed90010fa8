// MPI backend under mpirun: the control plane, process sets alongside world negotiation,
// chunking at the cap, timeout, abort and bad groups; every op x dtype x reduce op x count
// is the conformance suite's (test/conformance). Every rank runs the same test cases in the same order, so
// checks collect failures and assert after the collective calls (a skipped collective on
// one rank would turn one failure into a hang).
#include "backends/mpi/mpi_backend.h"
#include "backends/mpi/mpi_transport.h"
#include "test/backends/backend_test_util.h"

#include "test/catch.h"

#include <mpi.h>

#include <numeric>
#include <thread>

namespace tutti {
namespace test {
namespace {

constexpr double kDeadline = 60.0;

BackendOptions testOptions() {
  BackendOptions options;
  options.timeout_seconds = kDeadline;
  return options;
}

// Made on first use, in the same order on every rank; destroyed (MPI_Finalize) at exit.
Transport& transport() {
  static std::unique_ptr<Transport> t = makeMpiTransport(testOptions());
  return *t;
}
std::vector<int> worldRanks() {
  std::vector<int> ranks(transport().size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}
Backend& world() {
  static std::unique_ptr<Backend> b = transport().makeBackend(worldRanks(), 0);
  return *b;
}
ControlPlane& worldControl() {
  static std::unique_ptr<ControlPlane> c = transport().makeControlPlane(worldRanks(), 0);
  return *c;
}

void checkAllreduce(Backend& backend, Failures& failures, int64_t count, DataType dtype,
                    ReduceOp op, int salt, bool in_place) {
  const int n = backend.size(), rank = backend.rank();
  auto in = makeInput(dtype, op, rank, n, count, salt);
  std::vector<uint8_t> out(in.size(), 0xEE);
  void* dst = in_place ? in.data() : out.data();
  backend.allreduce(in.data(), dst, count, dtype, op, deadlineAfter(kDeadline));
  checkReduced(failures, "allreduce count " + std::to_string(count), dtype, op, n, dst, 0, count,
               salt);
}

void checkReducescatter(Backend& backend, Failures& failures, const std::vector<int64_t>& counts,
                        DataType dtype, ReduceOp op, int salt, bool in_place) {
  const int n = backend.size(), rank = backend.rank();
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
  auto in = makeInput(dtype, op, rank, n, total, salt);
  std::vector<uint8_t> out((counts[rank] + 1) * dataTypeSize(dtype), 0xEE);
  void* dst = in_place ? in.data() : out.data();
  backend.reducescatter(in.data(), dst, counts, dtype, op, deadlineAfter(kDeadline));
  checkReduced(failures, "reducescatter total " + std::to_string(total), dtype, op, n, dst,
               offset, counts[rank], salt);
}

// allgatherv, broadcast from every root and alltoallv of pattern bytes.
void checkMovement(Backend& backend, Failures& failures, int64_t base, DataType dtype,
                   int salt) {
  const int n = backend.size(), rank = backend.rank();
  const int64_t esz = dataTypeSize(dtype);
  const std::string what = " base " + std::to_string(base) + " " + dataTypeName(dtype);
  const Deadline deadline = deadlineAfter(kDeadline);
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = (base + r * salt) % (base + 2);
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
  std::vector<uint8_t> gathered(total * esz + 1, 0xEE);
  // Odd salts gather in place (own block already at its offset in the output).
  uint8_t* mine = gathered.data() + offset * esz;
  std::vector<uint8_t> separate(counts[rank] * esz + 1);
  if (salt % 2 == 0) mine = separate.data();
  for (int64_t b = 0; b < counts[rank] * esz; ++b) mine[b] = patternByte(dtype, rank, b, salt);
  backend.allgatherv(mine, gathered.data(), counts, dtype, deadline);
  for (int r = 0, off = 0; r < n; off += counts[r] * esz, ++r)
    for (int64_t b = 0; b < counts[r] * esz; ++b)
      if (gathered[off + b] != patternByte(dtype, r, b, salt)) {
        failures.add("allgatherv" + what + ": block of rank " + std::to_string(r) + " wrong");
        break;
      }
  checkBroadcastFromEveryRoot(backend, rank, n, base, dtype, salt, what, failures, deadline);
  checkAlltoallv(backend, rank, n, base, dtype, salt, what, failures, deadline);
}

void checkControlPlane(ControlPlane& control, Failures& failures, int round) {
  const int n = control.size(), rank = control.rank();
  std::string mine((rank * 3 + round) % 5, static_cast<char>('a' + rank));
  auto all = control.gather(mine, deadlineAfter(kDeadline));
  if (rank == 0) {
    if (static_cast<int>(all.size()) != n) failures.add("gather: wrong number of entries");
    for (int r = 0; r < n && r < static_cast<int>(all.size()); ++r)
      if (all[r] != std::string((r * 3 + round) % 5, static_cast<char>('a' + r)))
        failures.add("gather: wrong bytes from member " + std::to_string(r));
  } else if (!all.empty()) {
    failures.add("gather: a non-root member got entries");
  }
  std::string expected = std::string(100 + round, 'x') + char(round);
  if (control.broadcast(rank == 0 ? expected : "other", deadlineAfter(kDeadline)) != expected)
    failures.add("broadcast: wrong bytes");
  std::vector<uint64_t> bits(2 + round, ~uint64_t{0});
  for (size_t w = 0; w < bits.size(); ++w)
    for (int b = 0; b < 64; ++b)
      if (static_cast<int>((w * 64 + b) % (n + 1)) == rank) bits[w] &= ~(uint64_t{1} << b);
  control.allreduceAnd(bits, deadlineAfter(kDeadline));
  for (size_t w = 0; w < bits.size(); ++w) {
    uint64_t expected_word = ~uint64_t{0};
    for (int b = 0; b < 64; ++b)
      if (static_cast<int>((w * 64 + b) % (n + 1)) < n) expected_word &= ~(uint64_t{1} << b);
    if (bits[w] != expected_word) failures.add("allreduceAnd: word " + std::to_string(w));
  }
}

TEST_CASE("mpi control plane: gather, broadcast, allreduceAnd") {
  Failures failures;
  CHECK(worldControl().size() == transport().size());
  CHECK(worldControl().rank() == transport().rank());
  for (int round = 0; round < 4; ++round) checkControlPlane(worldControl(), failures, round);
  REQUIRE(failures.summary() == "0 failure(s)");
}

TEST_CASE("mpi process sets: even and odd ranks, concurrent with world negotiation") {
  const int rank = transport().rank(), size = transport().size();
  std::vector<int> members;
  for (int r = rank % 2; r < size; r += 2) members.push_back(r);
  const int id = 1 + rank % 2;  // 1 = even ranks, 2 = odd ranks
  auto control = transport().makeControlPlane(members, id);
  auto backend = transport().makeBackend(members, id);
  CHECK(backend->size() == static_cast<int>(members.size()));
  CHECK(backend->rank() == rank / 2);
  Failures failures;
  // The world control plane runs on another thread while the set moves data.
  std::thread negotiation([&] {
    try {
      for (int round = 0; round < 6; ++round) checkControlPlane(worldControl(), failures, round);
    } catch (const std::exception& e) {
      failures.add(std::string("world control plane threw: ") + e.what());
    }
  });
  int salt = 100;
  for (DataType dtype : {DataType::kFloat16, DataType::kInt32, DataType::kBool})
    for (ReduceOp op : allReduceOps())
      for (int64_t count : {int64_t{0}, int64_t{5}, int64_t{4097}}) {
        ++salt;
        checkAllreduce(*backend, failures, count, dtype, op, salt, salt % 2 == 0);
      }
  for (DataType dtype : {DataType::kUInt8, DataType::kFloat64})
    checkMovement(*backend, failures, 33, dtype, ++salt);
  for (int round = 0; round < 3; ++round) checkControlPlane(*control, failures, round);
  negotiation.join();
  world().barrier(deadlineAfter(kDeadline));
  REQUIRE(failures.summary() == "0 failure(s)");
}

TEST_CASE("mpi ops larger than one MPI call are split into chunks") {
  // A second transport finds MPI initialized (MPI_THREAD_MULTIPLE) and caps calls at 1000
  // elements, so every path for counts above INT_MAX runs here with small buffers.
  auto small = makeMpiTransport(testOptions(), 1000);
  auto backend = small->makeBackend(worldRanks(), 10);
  const int n = backend->size();
  Failures failures;
  checkAllreduce(*backend, failures, 10007, DataType::kInt64, ReduceOp::kSum, 1, false);
  checkAllreduce(*backend, failures, 3001, DataType::kBFloat16, ReduceOp::kProduct, 2, true);
  // allgatherv (totals > 1000: a chunked broadcast per member), broadcast, alltoallv.
  checkMovement(*backend, failures, 2501, DataType::kFloat32, 3);
  checkMovement(*backend, failures, 1999, DataType::kUInt8, 4);
  // reducescatter: totals > 1000, blocks above and below the cap, an empty one.
  int salt = 10;
  for (bool in_place : {false, true})
    for (DataType dtype : {DataType::kInt32, DataType::kFloat16, DataType::kBool}) {
      std::vector<int64_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : 700 + 900 * r + salt;
      checkReducescatter(*backend, failures, counts, dtype, ReduceOp::kMax, ++salt, in_place);
      checkReducescatter(*backend, failures, counts, dtype, ReduceOp::kSum, ++salt, in_place);
    }
  backend->barrier(deadlineAfter(kDeadline));
  REQUIRE(failures.summary() == "0 failure(s)");
}

// A timeout or an abort is fatal to the whole transport (the job alarm reaches every rank),
// so these cases run on transports of their own, leaving world() usable.
TEST_CASE("mpi timeout poisons the group, names op, group and seconds, and alarms the others") {
  auto own = makeMpiTransport(testOptions());
  const int rank = own->rank(), size = own->size();
  auto backend = own->makeBackend(worldRanks(), 50);
  auto control = own->makeControlPlane(worldRanks(), 50);
  if (size > 1) {
    if (rank != 0) {
      auto start = Clock::now();
      try {
        backend->barrier(deadlineAfter(0.5));
        FAIL("barrier without rank 0 did not time out");
      } catch (const Error& e) {
        // Its own timeout, or (np > 2) the alarm of another rank that timed out first.
        CHECK((e.code() == StatusCode::kTimeout ||
               (e.code() == StatusCode::kAborted &&
                std::string(e.what()).find("failed and stopped the job") != std::string::npos)));
        CHECK_THAT(e.what(), Catch::Contains("mpi barrier on group 50") &&
                                 Catch::Contains("timed out after 0.5 s"));
      }
      CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5.0);
      // Later calls on the group, data or control plane, fail at once with the same error.
      float x = 1;
      CHECK_THROWS_WITH(backend->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum,
                                           deadlineAfter(kDeadline)),
                        Catch::Contains("timed out after 0.5 s"));
      CHECK_THROWS_WITH(control->broadcast("x", deadlineAfter(kDeadline)),
                        Catch::Contains("timed out after 0.5 s"));
    }
    world().barrier(deadlineAfter(kDeadline));
    if (rank == 0) {
      // Rank 0 arrives late: the others' timeouts reached it through the alarm, so its
      // barrier fails at once (it would otherwise wait kDeadline for ranks that left).
      auto start = Clock::now();
      try {
        backend->barrier(deadlineAfter(kDeadline));
        FAIL("the late barrier did not learn of the others' timeout");
      } catch (const Error& e) {
        CHECK(e.code() == StatusCode::kAborted);
        CHECK_THAT(e.what(), Catch::Contains("failed and stopped the job") &&
                                 Catch::Contains("mpi barrier on group 50") &&
                                 Catch::Contains("timed out after 0.5 s"));
      }
      CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5.0);
    }
    world().barrier(deadlineAfter(kDeadline));
  }
}

TEST_CASE("mpi abort wakes a waiting call with the reason") {
  auto own = makeMpiTransport(testOptions());
  const int rank = own->rank();
  auto backend = own->makeBackend(worldRanks(), 60);
  if (rank == 0 && own->size() > 1) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      backend->abort("test abort from another thread");
    });
    auto start = Clock::now();
    try {
      backend->barrier(deadlineAfter(kDeadline));  // the others are not there yet
      FAIL("barrier was not aborted");
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kAborted);
      CHECK(std::string(e.what()) == "test abort from another thread");
    }
    CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5.0);
    aborter.join();
    world().barrier(deadlineAfter(kDeadline));
  } else {
    if (own->size() > 1) world().barrier(deadlineAfter(kDeadline));
    backend->abort("test abort");
    CHECK_THROWS_WITH(backend->barrier(deadlineAfter(kDeadline)), "test abort");
  }
  world().barrier(deadlineAfter(kDeadline));
}

TEST_CASE("mpi supports every CPU op and dtype, not CUDA; rejects bad groups") {
  for (int op = 0; op < kNumOpTypes; ++op)
    for (DataType dtype : allDataTypes()) {
      CHECK(world().supports(static_cast<OpType>(op), dtype, DeviceType::kCpu));
      CHECK_FALSE(world().supports(static_cast<OpType>(op), dtype, DeviceType::kCuda));
    }
  CHECK(std::string(transport().name()) == "mpi");
  CHECK(std::string(world().name()) == "mpi");
  int size = transport().size();
  CHECK_THROWS_WITH(transport().makeBackend({size}, 70), Catch::Contains("sorted, distinct"));
  if (size > 1) {
    int other = transport().rank() == 0 ? 1 : 0;
    CHECK_THROWS_WITH(transport().makeBackend({other}, 71), Catch::Contains("not a member"));
  }
}

}  // namespace
}  // namespace test
}  // namespace tutti
