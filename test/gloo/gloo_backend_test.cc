// The gloo transport at this world size (run under `tuttirun -np N`): the control plane
// (gather, broadcast, AND; small and large messages), a subgroup made twice (a process set
// removed and added again connects afresh), a second transport in the same process, and
// ranks on "remote" hosts (the ssh variant). Every op x dtype x reduce op of the data plane
// is the conformance suite's (test/conformance). Exits non-zero on a failed check.
#include "backends/gloo/gloo_transport.h"
#include "test/gloo/gloo_test_util.h"

#include <algorithm>
#include <numeric>

using namespace tutti;
using namespace tutti::test;

namespace {

// One small allreduce: the group connects and moves data (the data-plane cases are the
// conformance suite's, test/conformance).
void testSmallAllreduce(Backend& be, Checker& c, Deadline deadline, const std::string& what) {
  const int n = be.size(), me = be.rank();
  std::vector<int64_t> v(5, me + 1);
  be.allreduce(v.data(), v.data(), 5, DataType::kInt64, ReduceOp::kSum, deadline);
  c.check(v == std::vector<int64_t>(5, int64_t{n} * (n + 1) / 2), "allreduce " + what);
}

void testControlPlane(ControlPlane& cp, Checker& c, Deadline deadline) {
  const int n = cp.size(), me = cp.rank();
  auto payload = [](int r, int round) {
    return std::string(static_cast<size_t>((r * 37 + round * 11) % 13 * (round == 2 ? 5000 : 1)),
                       static_cast<char>('a' + r));
  };
  for (int round = 0; round < 3; ++round) {
    auto got = cp.gather(payload(me, round), deadline);
    bool ok = me == 0 ? static_cast<int>(got.size()) == n : got.empty();
    for (int r = 0; ok && me == 0 && r < n; ++r) ok = got[r] == payload(r, round);
    c.check(ok, "control gather round " + std::to_string(round));
    for (size_t len : {size_t{0}, size_t{1}, size_t{100000}}) {
      std::string mine = me == 0 ? std::string(len, 'z') : "ignored";
      c.check(cp.broadcast(mine, deadline) == std::string(len, 'z'),
              "control broadcast of " + std::to_string(len) + " bytes");
    }
  }
  for (size_t words : {size_t{0}, size_t{1}, size_t{5}}) {
    std::vector<uint64_t> bits(words), expect(words, ~uint64_t{0});
    for (size_t w = 0; w < words; ++w) {
      bits[w] = ~(uint64_t{1} << ((me + w) % 64));
      for (int r = 0; r < n; ++r) expect[w] &= ~(uint64_t{1} << ((r + w) % 64));
    }
    cp.allreduceAnd(bits, deadline);
    c.check(bits == expect, "control allreduceAnd of " + std::to_string(words) + " words");
  }
}

}  // namespace

int main() {
  BackendOptions options = optionsFromEnv();
  const int rank = options.rank, size = options.size;
  Checker c(rank);
  try {
    auto transport = makeGlooTransport(options);
    std::vector<int> world(size);
    std::iota(world.begin(), world.end(), 0);
    auto cp = transport->makeControlPlane(world, 0);
    auto be = transport->makeBackend(world, 0);
    c.check(be->rank() == rank && be->size() == size && cp->rank() == rank,
            "world group ranks");
    const Deadline deadline = deadlineAfter(options.timeout_seconds);
    testControlPlane(*cp, c, deadline);
    testSmallAllreduce(*be, c, deadline, "on the world");
    be->barrier(deadline);

    // Subgroup: the odd world ranks, or {0} in a world of one. Created twice (a process set
    // removed and added again connects afresh).
    std::vector<int> odd;
    for (int r = 1; r < size; r += 2) odd.push_back(r);
    if (odd.empty()) odd.push_back(0);
    const bool member = std::find(odd.begin(), odd.end(), rank) != odd.end();
    for (int round = 0; member && round < 2; ++round) {
      auto sub_cp = transport->makeControlPlane(odd, 5);
      auto sub_be = transport->makeBackend(odd, 5);
      c.check(sub_be->size() == static_cast<int>(odd.size()) &&
                  odd[sub_be->rank()] == rank, "subgroup rank/size");
      testControlPlane(*sub_cp, c, deadline);
      testSmallAllreduce(*sub_be, c, deadline, "on the subgroup, round " + std::to_string(round));
      sub_be->barrier(deadline);
    }
    be->barrier(deadline);
    cp.reset();
    be.reset();
    transport.reset();

    // A second transport in the same process (init after shutdown) connects afresh.
    auto again = makeGlooTransport(options);
    auto be2 = again->makeBackend(world, 0);
    testSmallAllreduce(*be2, c, deadline, "on a second transport");
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 2;
  }
  return c.finish("gloo backend");
}
