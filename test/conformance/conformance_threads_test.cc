// The conformance suite (conformance.h) for the backends that run with threads as ranks in
// one process: loopback, shm (every member maps the same segment through its own mapping;
// 64 KiB buffers make the large count run many epochs) and hierarchical (made-up hosts:
// shm inside a "host", loopback groups across). World sizes 1-5 and, at 5, two process
// sets at once (even and odd ranks), each running the whole suite.
#include "backends/hierarchical/hier_backend.h"
#include "backends/hierarchical/two_level_control_plane.h"
#include "backends/loopback/loopback.h"
#include "backends/registry.h"
#include "backends/shm/shm_backend.h"
#include "test/conformance/conformance.h"

#include "test/catch.h"

#include <algorithm>
#include <functional>
#include <cstdlib>
#include <numeric>
#include <tuple>

namespace tutti {
namespace test {
namespace {

// Member `r`'s backend of one set, and what it needs kept alive (its control plane).
struct Member {
  std::unique_ptr<ControlPlane> control;
  std::unique_ptr<Backend> backend;
};
// Makes member `r`'s backend of the set `members` (world ranks, sorted), id `id`.
using Factory = std::function<Member(int r, const std::vector<int>& members, int id)>;

// The world's members and, for the largest world (5), the even and the odd ranks as two
// more sets (of 3 and 2, at once).
std::vector<std::vector<int>> setsOf(int n) {
  std::vector<int> world(n), even, odd;
  std::iota(world.begin(), world.end(), 0);
  for (int r = 0; r < n; ++r) (r % 2 ? odd : even).push_back(r);
  if (n < 5) return {world};
  return {world, even, odd};
}

// Every member runs the suite on the world, then on its own subset.
void runSuite(const char* name, int n, int64_t large_bytes, Failures& failures,
              const Factory& make) {
  runThreads(n, failures, [&](int r) {
    const auto sets = setsOf(n);
    for (size_t s = 0; s < sets.size(); ++s) {
      const auto& members = sets[s];
      if (std::find(members.begin(), members.end(), r) == members.end()) continue;
      Member member = make(r, members, static_cast<int>(10 + s));
      ConformanceOptions options;
      options.label = std::string(name) + " n=" + std::to_string(members.size()) +
                      (s == 0 ? "" : s == 1 ? " (even ranks)" : " (odd ranks)");
      options.large_bytes = large_bytes;
      runConformance(*member.backend, options, failures);
    }
  });
}

detail::ShmOptions smallShmBuffers() {
  detail::ShmOptions o;
  o.buffer_bytes = 64 << 10;
  o.setup_seconds = 30;
  return o;
}

// TUTTI_CONFORMANCE_MAX_MEMBERS (tests only; scripts/sanitize.sh sets it for TSan, where a
// member costs ~10x): loopback and shm run world sizes up to it, hierarchical the shapes of at
// most max(it, 4) members. Unset: every size.
int maxMembers() {
  const char* v = std::getenv("TUTTI_CONFORMANCE_MAX_MEMBERS");
  const int n = v && *v ? std::atoi(v) : 0;
  return n > 0 ? n : 1 << 20;
}

TEST_CASE("conformance: loopback, world sizes 1-5 and process sets") {
  for (int n = 1; n <= std::min(5, maxMembers()); ++n) {
    Failures failures;
    auto hub = makeLoopbackHub(n);
    runSuite("loopback", n, 256 << 10, failures,
             [&](int r, const std::vector<int>& members, int id) {
               return Member{nullptr, makeLoopbackTransport(hub, r)->makeBackend(members, id)};
             });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("conformance: shm, world sizes 2-5 and process sets, chunked") {
  for (int n = 2; n <= std::min(5, maxMembers()); ++n) {
    Failures failures;
    auto hub = makeLoopbackHub(n);
    runSuite("shm", n, 256 << 10, failures, [&](int r, const std::vector<int>& members, int id) {
      Member m;
      m.control = makeLoopbackTransport(hub, r)->makeControlPlane(members, id);
      m.backend = makeShmBackend(*m.control, members, id, smallShmBuffers());
      if (!m.backend)
        throwError(StatusCode::kInternal, "no shm backend for member " + std::to_string(r));
      return m;
    });
    INFO("world size " << n);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

// Each shape is {hosts, members per host, each host's ranks contiguous}; interleaved
// hosts put member r on host r % hosts. Hierarchical allgather is on, so allreduce and
// allgatherv run on the backend (it declines the other ops: the next backend runs them).
TEST_CASE("conformance: hierarchical, made-up hosts 2x2, 3x2, 2x3, interleaved or not") {
  const std::vector<std::tuple<int, int, bool>> shapes = {
      {2, 2, false}, {2, 2, true}, {3, 2, true}, {2, 3, false}};
  for (auto [hosts, per_host, blocked] : shapes) {
    const int n = hosts * per_host;
    if (n > std::max(4, maxMembers())) continue;
    const std::string label = "hierarchical " + std::to_string(hosts) + "x" +
                              std::to_string(per_host) + (blocked ? " blocked" : "");
    Failures failures;
    auto hub = makeLoopbackHub(n);
    std::vector<int> world(n);
    std::iota(world.begin(), world.end(), 0);
    std::vector<std::string> infos;
    for (int r = 0; r < n; ++r)
      infos.push_back(detail::encodeLayoutInfo(
          true, true, true, "h" + std::to_string(blocked ? r / per_host : r % hosts)));
    runThreads(n, failures, [&](int r) {
      auto transport = withShmControlPlanes(makeLoopbackTransport(hub, r), BackendOptions());
      const auto layout = detail::layoutFromInfos(3, n, world, r, infos);
      auto control = makeTwoLevelControlPlane(*transport, *transport,
                                              transport->makeControlPlane(world, 3), layout);
      auto flat = transport->makeBackend(world, 3);
      auto hier =
          makeHierarchicalBackend(*transport, *control, *flat, layout, true, smallShmBuffers());
      if (!hier) throwError(StatusCode::kInternal, label + ": no hierarchical backend");
      ConformanceOptions options;
      options.label = label;
      options.large_bytes = 256 << 10;
      runConformance(*hier, options, failures);
    });
    INFO(label);
    REQUIRE(failures.summary() == "0 failure(s)");
  }
}

}  // namespace
}  // namespace test
}  // namespace tutti
