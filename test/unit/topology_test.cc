// topologyFromHosts: local and cross rank and size from the hosts of the ranks, and the
// check of what the launcher said.
#include "core/topology.h"

#include "base/host_identity.h"

#include "test/catch.h"

#include <string>
#include <vector>

using tutti::Topology;

namespace {

Topology claim(int rank, int size) {
  Topology t;
  t.rank = rank;
  t.size = size;
  t.source = "test launcher";
  return t;
}

struct Row {
  int local_rank, local_size, cross_rank, cross_size;
};

std::vector<Row> all(const std::vector<std::string>& hosts) {
  std::vector<Row> rows;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    Topology t = tutti::topologyFromHosts(claim(r, static_cast<int>(hosts.size())), hosts);
    CHECK(t.rank == r);
    rows.push_back({t.local_rank, t.local_size, t.cross_rank, t.cross_size});
  }
  return rows;
}

bool same(const std::vector<Row>& got, const std::vector<Row>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].local_rank != want[i].local_rank || got[i].local_size != want[i].local_size ||
        got[i].cross_rank != want[i].cross_rank || got[i].cross_size != want[i].cross_size)
      return false;
  return true;
}

}  // namespace

TEST_CASE("topology: one host, and one rank per host") {
  CHECK(same(all({"a"}), {{0, 1, 0, 1}}));
  CHECK(same(all({"a", "a", "a"}), {{0, 3, 0, 1}, {1, 3, 0, 1}, {2, 3, 0, 1}}));
  CHECK(same(all({"a", "b", "c"}), {{0, 1, 0, 3}, {0, 1, 1, 3}, {0, 1, 2, 3}}));
}

TEST_CASE("topology: even, uneven and interleaved layouts") {
  // -H h1:2,h2:2
  CHECK(same(all({"h1", "h1", "h2", "h2"}),
             {{0, 2, 0, 2}, {1, 2, 0, 2}, {0, 2, 1, 2}, {1, 2, 1, 2}}));
  // -np 5 -H h1:2,h2:2,h3:1: rank 4 is cross rank 2 of 3 (not 4 of 5)
  CHECK(same(all({"h1", "h1", "h2", "h2", "h3"}),
             {{0, 2, 0, 3}, {1, 2, 0, 2}, {0, 2, 1, 3}, {1, 2, 1, 2}, {0, 1, 2, 3}}));
  // ranks placed round-robin over two hosts
  CHECK(same(all({"h1", "h2", "h1", "h2"}),
             {{0, 2, 0, 2}, {0, 2, 1, 2}, {1, 2, 0, 2}, {1, 2, 1, 2}}));
}

TEST_CASE("topology: values the launcher gave are checked") {
  std::vector<std::string> hosts = {"h1 boot", "h1 boot", "h2 boot", "h2 boot"};
  Topology good = claim(2, 4);
  good.local_given = good.cross_given = true;
  good.local_rank = 0;
  good.local_size = 2;
  good.cross_rank = 1;
  good.cross_size = 2;
  Topology t = tutti::topologyFromHosts(good, hosts);
  CHECK((t.local_rank == 0 && t.cross_rank == 1));

  // A nodefile naming each host once per slot, read as distinct hosts: every rank local 0.
  Topology wrong = good;
  wrong.local_size = 1;
  wrong.cross_rank = 2;
  wrong.cross_size = 4;
  try {
    tutti::topologyFromHosts(wrong, hosts);
    FAIL("expected a disagreement");
  } catch (const tutti::Error& e) {
    std::string m = e.what();
    CHECK(m.find("rank 2: test launcher says local rank 0 of 1, but the job's hosts give "
                 "local rank 0 of 2") == 0);
    CHECK(m.find("'h2' with 2 of the job's 4 ranks on 2 hosts") != std::string::npos);
  }
  wrong = good;
  wrong.cross_rank = 0;
  try {
    tutti::topologyFromHosts(wrong, hosts);
    FAIL("expected a disagreement");
  } catch (const tutti::Error& e) {
    CHECK(std::string(e.what()).find("says cross rank 0 of 2, but the job's hosts give cross "
                                     "rank 1 of 2") != std::string::npos);
  }
  // Not given: nothing to check.
  wrong.cross_given = false;
  CHECK(tutti::topologyFromHosts(wrong, hosts).cross_rank == 1);
}

TEST_CASE("topology: host identity is one line with the host name first") {
  std::string id = tutti::hostIdentity();
  CHECK(id.find('\n') == std::string::npos);
  CHECK(!id.empty());
  CHECK(id[0] != ' ');
}
