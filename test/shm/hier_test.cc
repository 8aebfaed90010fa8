// The hierarchical backend's own behaviour with threads as ranks (host layouts, what it
// supports, switching at run time, uneven hosts, the two-level AND): made-up host layouts
// (hosts.size() x per-host members, hosts interleaved by rank) over the loopback transport
// wrapped with shm control planes, so every sub-group is real: shm segments inside a
// "host", loopback groups across. Every allreduce and allgatherv case is the conformance
// suite's (test/conformance).
#include "backends/hierarchical/hier_backend.h"
#include "backends/hierarchical/two_level_control_plane.h"
#include "backends/loopback/loopback.h"
#include "backends/registry.h"
#include "test/backends/backend_test_util.h"

#include "test/catch.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <tuple>

namespace tutti {
namespace test {
namespace {

// Member r runs on host (r % hosts): ranks of one host are not contiguous; `blocked`:
// on host (r / per_host), each host's ranks contiguous.
std::vector<std::string> infosFor(int hosts, int per_host, bool hierarchical,
                                  bool allgather = false, bool blocked = false) {
  std::vector<std::string> infos;
  for (int r = 0; r < hosts * per_host; ++r)
    infos.push_back(detail::encodeLayoutInfo(
        true, hierarchical, allgather, "h" + std::to_string(blocked ? r / per_host : r % hosts)));
  return infos;
}

struct Rank {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ControlPlane> control;  // two-level
  std::unique_ptr<Backend> flat;
  std::unique_ptr<Backend> hierarchical;
};

void runRanks(int hosts, int per_host, bool on, Failures& failures,
              const std::function<void(int, Rank&)>& fn, bool allgather = false,
              bool blocked = false) {
  const int n = hosts * per_host;
  auto hub = makeLoopbackHub(n);
  std::vector<int> world(n);
  std::iota(world.begin(), world.end(), 0);
  const auto infos = infosFor(hosts, per_host, on, allgather, blocked);
  runThreads(n, failures, [&](int r) {
    Rank rank;
    rank.transport = withShmControlPlanes(makeLoopbackTransport(hub, r), BackendOptions());
    auto layout = detail::layoutFromInfos(3, n, world, r, infos);
    rank.control = makeTwoLevelControlPlane(*rank.transport, *rank.transport,
                                            rank.transport->makeControlPlane(world, 3), layout);
    rank.flat = rank.transport->makeBackend(world, 3);
    detail::ShmOptions shm;
    shm.buffer_bytes = 64 << 10;
    rank.hierarchical =
        makeHierarchicalBackend(*rank.transport, *rank.control, *rank.flat, layout, on, shm);
    fn(r, rank);
  });
}

TEST_CASE("host layout: hosts by first member, local and cross groups, distinct sub-group ids") {
  const std::vector<int> ranks = {1, 2, 4, 5, 7, 9};
  auto infos = infosFor(3, 2, true);  // members 0..5 on h0 h1 h2 h0 h1 h2
  auto l = detail::layoutFromInfos(2, 10, ranks, 4, infos);
  CHECK(l.hosts() == 3);
  CHECK(l.even());
  CHECK(l.spansSharedHosts());
  CHECK(l.host == 1);
  CHECK(l.local == 1);
  CHECK(l.localRanks() == std::vector<int>{2, 7});
  CHECK(l.crossRanks() == std::vector<int>{5, 7, 9});
  CHECK(l.leaderRanks() == std::vector<int>{1, 2, 4});
  CHECK(l.hierarchical);
  CHECK_FALSE(l.hierarchical_allgather);
  CHECK(detail::layoutFromInfos(2, 10, ranks, 4, infosFor(3, 2, false, true))
            .hierarchical_allgather);
  std::vector<int> ids;
  for (int me = 0; me < 6; ++me) {
    auto m = detail::layoutFromInfos(2, 10, ranks, me, infos);
    for (int id : {m.localControlId(), m.localDataId(), m.crossId(), m.leadersId()}) {
      CHECK(id < 0);
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  // 3 local groups x 2 planes + 2 cross groups + 1 leaders group: each id shared only
  // by the members of one group.
  CHECK(std::unique(ids.begin(), ids.end()) - ids.begin() == 9);
  infos[5] = detail::encodeLayoutInfo(false, true, false, "h0");  // uneven, and shm off on one
  auto u = detail::layoutFromInfos(2, 10, ranks, 0, infos);
  CHECK_FALSE(u.even());
  CHECK(u.spansSharedHosts());
  CHECK_FALSE(u.shm);
}

TEST_CASE("hierarchical: what it supports, and the two-level AND, 2x2, 3x2 and 2x3") {
  for (auto shape : {std::make_pair(2, 2), std::make_pair(3, 2), std::make_pair(2, 3)}) {
    const int n = shape.first * shape.second;
    Failures failures;
    runRanks(shape.first, shape.second, true, failures, [&](int r, Rank& rank) {
      if (!rank.hierarchical) return failures.add("no hierarchical backend");
      // Catch's CHECK is not thread-safe: ranks report through `failures`.
      if (!rank.hierarchical->supports(OpType::kAllreduce, DataType::kBFloat16,
                                       DeviceType::kCpu))
        failures.add("bfloat16 allreduce not supported");
      if (rank.hierarchical->supports(OpType::kAllgather, DataType::kFloat32, DeviceType::kCpu))
        failures.add("allgather supported while hierarchical allgather is off");
      // The negotiation's AND, in two levels: bit i cleared by member i % n only.
      for (size_t words : {size_t(0), size_t(1), size_t(9000)}) {
        std::vector<uint64_t> bits(words, ~uint64_t(0));
        for (size_t i = 0; i < words; ++i)
          if (static_cast<int>(i % n) == r) bits[i] &= ~(uint64_t(1) << (i % 64));
        rank.control->allreduceAnd(bits, deadlineAfter(30));
        for (size_t i = 0; i < words; ++i)
          if (bits[i] != ~(uint64_t(1) << (i % 64)))
            return failures.add("AND of " + std::to_string(words) + " words: word " +
                                std::to_string(i) + " wrong");
      }
    });
    INFO(shape.first << " hosts x " << shape.second);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("hierarchical allgather, when on, is supported and names its shm step") {
  Failures failures;
  runRanks(2, 2, true, failures, [&](int, Rank& rank) {
    if (!rank.hierarchical) return failures.add("no hierarchical backend");
    if (!rank.hierarchical->supports(OpType::kAllgather, DataType::kBFloat16, DeviceType::kCpu))
      failures.add("bfloat16 allgather not supported");
    if (std::string(rank.hierarchical->algorithm(OpType::kAllgather, 4)).find("shm") ==
        std::string::npos)
      failures.add("algorithm() does not name the shm step");
  }, true);
  REQUIRE(failures.summary() == "0 failure(s)");
}

TEST_CASE("hierarchical allreduce switched at run time, and uneven hosts decline") {
  Failures failures;
  runRanks(2, 2, false, failures, [&](int r, Rank& rank) {
    if (!rank.hierarchical) return failures.add("made off, it must still be made");
    for (bool on : {true, false, true}) {
      if (!rank.hierarchical->setSwitch(BackendSwitch::kHierarchicalAllreduce, on))
        failures.add("setSwitch refused");
      auto in = makeInput(DataType::kFloat32, ReduceOp::kSum, r, 4, 1001, on);
      rank.hierarchical->allreduce(in.data(), in.data(), 1001, DataType::kFloat32,
                                   ReduceOp::kSum, deadlineAfter(30));
      checkReduced(failures, "switched", DataType::kFloat32, ReduceOp::kSum, 4, in.data(), 0,
                   1001, on);
    }
    if (rank.flat->setSwitch(BackendSwitch::kHierarchicalAllreduce, true))
      failures.add("setSwitch took a flat backend");
    if (rank.hierarchical->switchState(BackendSwitch::kHierarchicalAllreduce) != 1)
      failures.add("switchState is not 1 after it was switched on");
  });
  REQUIRE(failures.summary() == "0 failure(s)");
  // 3 members on two hosts: no hierarchical backend, the AND still in two levels.
  auto hub = makeLoopbackHub(3);
  const std::vector<std::string> infos = {"1 1 1 a", "1 1 1 b", "1 1 1 a"};
  runThreads(3, failures, [&](int r) {
    auto transport = withShmControlPlanes(makeLoopbackTransport(hub, r), BackendOptions());
    auto layout = detail::layoutFromInfos(4, 3, {0, 1, 2}, r, infos);
    auto control = makeTwoLevelControlPlane(*transport, *transport,
                                            transport->makeControlPlane({0, 1, 2}, 4), layout);
    auto flat = transport->makeBackend({0, 1, 2}, 4);
    if (makeHierarchicalBackend(*transport, *control, *flat, layout, true, {}))
      failures.add("uneven hosts got a hierarchical backend");
    std::vector<uint64_t> bits = {r == 1 ? uint64_t(6) : uint64_t(7)};
    control->allreduceAnd(bits, deadlineAfter(30));
    if (bits[0] != 6) failures.add("uneven AND: got " + std::to_string(bits[0]));
  });
  REQUIRE(failures.summary() == "0 failure(s)");
}

}  // namespace
}  // namespace test
}  // namespace tutti
