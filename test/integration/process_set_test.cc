// Process sets across real processes: even and odd ranks working at once, every op inside a
// set (roots and averages relative to the set), non-members, removal, and sets registered
// differently on different ranks.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <algorithm>
#include <cstdlib>

using namespace tutti;
using namespace tutti::itest;

namespace {

std::vector<int> ranksWithParity(int parity) {
  std::vector<int> out;
  for (int r = parity; r < size(); r += 2) out.push_back(r);
  return out;
}

// The same value of `id` on every rank? (allreduce min == max)
bool sameOnEveryRank(int64_t id) {
  HostTensor lo(DataType::kInt64, {1}), hi(DataType::kInt64, {1});
  lo.set(0, static_cast<double>(id));
  hi.set(0, static_cast<double>(id));
  OpOptions mn, mx;
  mn.op = ReduceOp::kMin;
  mx.op = ReduceOp::kMax;
  Handle a = 0, b = 0;
  REQUIRE(allreduceAsync("ps.same.min", lo.view(), lo.view(), mn, &a).ok());
  REQUIRE(allreduceAsync("ps.same.max", hi.view(), hi.view(), mx, &b).ok());
  REQUIRE(waitFor(a).ok());
  REQUIRE(waitFor(b).ok());
  return lo.get(0) == hi.get(0);
}

// Runs allreduce (sum, average), broadcast, allgather, reducescatter, alltoall and a barrier
// inside `set` (whose world ranks are `members`), all submitted before any wait, together
// with one global allreduce named `global` (the same name on every rank of the job).
void exerciseSet(int set, const std::vector<int>& members, const std::string& tag,
                 const std::string& global) {
  const int me = rank();
  const int m = static_cast<int>(members.size());
  const int my_index = static_cast<int>(std::find(members.begin(), members.end(), me) -
                                        members.begin());
  REQUIRE(my_index < m);
  const DataType d = DataType::kFloat64;
  const uint64_t seed = 700 + static_cast<uint64_t>(set);
  OpOptions o;
  o.process_set = set;

  HostTensor sum_in(d, {9}), sum_x(d, {9}), avg_in(DataType::kInt32, {4}),
      avg_x(DataType::kInt32, {4});
  fillInput(sum_in, ReduceOp::kSum, me, seed);
  fillInput(avg_in, ReduceOp::kAverage, me, seed + 1);
  for (int64_t i = 0; i < 9; ++i) {
    std::vector<double> a, b;
    for (int r : members) {
      a.push_back(inputValue(d, ReduceOp::kSum, r, seed, i));
      b.push_back(inputValue(DataType::kInt32, ReduceOp::kAverage, r, seed + 1, i));
    }
    sum_x.set(i, referenceReduce(d, ReduceOp::kSum, a, 1, 1, m));
    if (i < 4) avg_x.set(i, referenceReduce(DataType::kInt32, ReduceOp::kAverage, b, 1, 1, m));
  }
  // Broadcast from the set's last member (a set rank, not a world rank).
  HostTensor bc(d, {6}), bc_x(d, {6});
  fillInput(bc, ReduceOp::kSum, me, seed + 2);
  fillInput(bc_x, ReduceOp::kSum, members.back(), seed + 2);
  // Allgather: member k sends k + 1 rows.
  HostTensor ag(d, {my_index + 1, 2});
  fillInput(ag, ReduceOp::kSum, me, seed + 3);
  int64_t ag_rows = static_cast<int64_t>(m) * (m + 1) / 2;
  HostTensor ag_x(d, {ag_rows, 2});
  int64_t at = 0;
  for (int k = 0; k < m; ++k)
    for (int64_t i = 0; i < (k + 1) * 2; ++i)
      ag_x.set(at++, inputValue(d, ReduceOp::kSum, members[static_cast<size_t>(k)], seed + 3, i));
  // Reducescatter of m + 1 rows: set rank 0 gets two rows, the others one.
  HostTensor rs(d, {m + 1}), rs_x(d, {my_index == 0 ? 2 : 1});
  fillInput(rs, ReduceOp::kMax, me, seed + 4);
  int64_t first = my_index == 0 ? 0 : my_index + 1;
  for (int64_t i = 0; i < rs_x.numel(); ++i) {
    std::vector<double> v;
    for (int r : members) v.push_back(inputValue(d, ReduceOp::kMax, r, seed + 4, first + i));
    rs_x.set(i, referenceReduce(d, ReduceOp::kMax, v, 1, 1, m));
  }
  // Alltoall with equal splits: one row to each member.
  HostTensor a2a(d, {m}), a2a_x(d, {m});
  fillInput(a2a, ReduceOp::kSum, me, seed + 5);
  for (int k = 0; k < m; ++k)
    a2a_x.set(k, inputValue(d, ReduceOp::kSum, members[static_cast<size_t>(k)], seed + 5, my_index));
  // A global allreduce in flight at the same time.
  HostTensor g(DataType::kInt32, {3}), g_x(DataType::kInt32, {3});
  fillInput(g, ReduceOp::kSum, me, 799);
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<double> v;
    for (int r = 0; r < size(); ++r) v.push_back(inputValue(DataType::kInt32, ReduceOp::kSum, r, 799, i));
    g_x.set(i, referenceReduce(DataType::kInt32, ReduceOp::kSum, v, 1, 1, size()));
  }

  Handle h_sum = 0, h_avg = 0, h_bc = 0, h_ag = 0, h_rs = 0, h_a2a = 0, h_bar = 0, h_g = 0;
  OpOptions avg = o, bco = o, rso = o;
  avg.op = ReduceOp::kAverage;
  bco.root = m - 1;
  rso.op = ReduceOp::kMax;
  REQUIRE(allreduceAsync(tag + ".sum", sum_in.view(), sum_in.view(), o, &h_sum).ok());
  REQUIRE(allreduceAsync(tag + ".avg", avg_in.view(), avg_in.view(), avg, &h_avg).ok());
  REQUIRE(broadcastAsync(tag + ".bc", bc.view(), bco, &h_bc).ok());
  REQUIRE(allgatherAsync(tag + ".ag", ag.view(), o, &h_ag).ok());
  REQUIRE(reducescatterAsync(tag + ".rs", rs.view(), rso, &h_rs).ok());
  REQUIRE(alltoallAsync(tag + ".a2a", a2a.view(), o, &h_a2a).ok());
  REQUIRE(barrierAsync(set, &h_bar).ok());
  REQUIRE(allreduceAsync(global, g.view(), g.view(), OpOptions(), &h_g).ok());

  INFO("rank " << me << " (set rank " << my_index << " of " << m << ", set " << set << ")");
  CHECK(describe(waitFor(h_sum)) == "kOk");
  CHECK(compare(sum_x, sum_in.data(), 9, tag + ".sum") == "");
  CHECK(describe(waitFor(h_avg)) == "kOk");
  CHECK(compare(avg_x, avg_in.data(), 4, tag + ".avg (divides by the set size)") == "");
  CHECK(describe(waitFor(h_bc)) == "kOk");
  CHECK(compare(bc_x, bc.data(), 6, tag + ".bc") == "");
  Result r;
  CHECK(describe(waitFor(h_ag, &r)) == "kOk");
  CHECK(listText(r.shape) == listText(ag_x.shape()));
  CHECK(compare(ag_x, r.data, r.data ? ag_x.numel() : 0, tag + ".ag") == "");
  std::free(r.data);
  r = Result();
  CHECK(describe(waitFor(h_rs, &r)) == "kOk");
  CHECK(listText(r.shape) == listText(rs_x.shape()));
  CHECK(compare(rs_x, r.data, rs_x.numel(), tag + ".rs") == "");
  std::free(r.data);
  r = Result();
  CHECK(describe(waitFor(h_a2a, &r)) == "kOk");
  CHECK(listText(r.recv_splits) == listText(std::vector<int64_t>(static_cast<size_t>(m), 1)));
  CHECK(compare(a2a_x, r.data, a2a_x.numel(), tag + ".a2a") == "");
  std::free(r.data);
  CHECK(describe(waitFor(h_bar)) == "kOk");
  CHECK(describe(waitFor(h_g)) == "kOk");
  CHECK(compare(g_x, g.data(), 3, global) == "");
}

}  // namespace

TEST_CASE("even and odd ranks work in their own sets at once", "[process_set]") {
  requireInit();
  const int me = rank();
  const std::vector<int> evens = ranksWithParity(0), odds = ranksWithParity(1);
  int even_set = -1, odd_set = -1;
  Status s = addProcessSet(evens, &even_set);
  INFO("addProcessSet(" << listText(evens) << "): " << describe(s));
  REQUIRE(s.ok());
  CHECK(even_set > 0);
  if (!odds.empty()) {
    s = addProcessSet(odds, &odd_set);
    INFO("addProcessSet(" << listText(odds) << "): " << describe(s));
    REQUIRE(s.ok());
    CHECK(odd_set > 0);
    CHECK(odd_set != even_set);
    CHECK(sameOnEveryRank(odd_set));
  }
  CHECK(sameOnEveryRank(even_set));
  CHECK(processSetSize(even_set) == static_cast<int>(evens.size()));
  CHECK(listText(processSetRanks(even_set)) == listText(evens));
  CHECK(processSetRank(even_set) == (me % 2 == 0 ? me / 2 : -1));
  CHECK(tutti_process_set_rank(even_set) == (me % 2 == 0 ? me / 2 : -1));
  CHECK(processSetSize(TUTTI_GLOBAL_PROCESS_SET) == size());
  CHECK(processSetRank(TUTTI_GLOBAL_PROCESS_SET) == me);
  if (!odds.empty()) {
    CHECK(processSetRank(odd_set) == (me % 2 == 1 ? me / 2 : -1));
    CHECK(tutti_process_set_size(odd_set) == static_cast<int>(odds.size()));
  }

  for (int round = 0; round < 8; ++round) {
    std::string tag = "ps.r" + std::to_string(round % 2);  // names repeat: the cache per set
    if (me % 2 == 0) {
      exerciseSet(even_set, evens, tag + ".even", tag + ".global");
    } else {
      exerciseSet(odd_set, odds, tag + ".odd", tag + ".global");
    }
  }

  // A non-member submitting to a set gets kInvalidArgument (at submission or from wait).
  const int other = me % 2 == 0 ? odd_set : even_set;
  if (other > 0) {
    HostTensor t(DataType::kFloat32, {4});
    t.fill(1.0);
    OpOptions o;
    o.process_set = other;
    Handle h = 0;
    Status st = allreduceAsync("ps.nonmember", t.view(), t.view(), o, &h);
    if (st.ok()) st = waitFor(h);
    INFO("rank " << me << " submits to set " << other << " it is not in: " << describe(st));
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(!st.message().empty());
    Handle hb = 0;
    st = barrierAsync(other, &hb);
    if (st.ok()) st = waitFor(hb);
    CHECK(st.code() == StatusCode::kInvalidArgument);
  }

  // Removal is collective too; the id is unknown afterwards.
  REQUIRE(removeProcessSet(even_set).ok());
  if (odd_set > 0) REQUIRE(removeProcessSet(odd_set).ok());
  CHECK(processSetSize(even_set) == -1);
  HostTensor t(DataType::kFloat32, {2});
  OpOptions o;
  o.process_set = even_set;
  Handle h = 0;
  Status st = allreduceAsync("ps.removed", t.view(), t.view(), o, &h);
  if (st.ok()) st = waitFor(h);
  INFO("allreduce on removed set " << even_set << ": " << describe(st));
  CHECK(st.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("invalid process set lists are rejected", "[process_set]") {
  requireInit();
  const int n = size();
  int id = -1;
  const std::vector<std::vector<int>> bad = {
      {}, {0, 0}, {n}, {-1}, {0, n + 3}};  // empty, duplicate, out of range
  for (const auto& ranks : bad) {
    Status s = addProcessSet(ranks, &id);
    INFO("addProcessSet(" << listText(ranks) << "): " << describe(s));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(!s.message().empty());
  }
  if (n >= 2) {
    // Not sorted: the API asks for a sorted list; a runtime may reject it or sort it.
    Status s = addProcessSet({1, 0}, &id);
    INFO("addProcessSet([1,0]): " << describe(s));
    if (s.ok()) {
      CHECK(listText(processSetRanks(id)) == "[0,1]");
      CHECK(removeProcessSet(id).ok());
    } else {
      CHECK(s.code() == StatusCode::kInvalidArgument);
    }
  }
  CHECK(tutti_add_process_set(nullptr, 1, &id) == TUTTI_ERR_INVALID_ARGUMENT);
  int zero = 0;
  CHECK(tutti_add_process_set(&zero, 1, nullptr) == TUTTI_ERR_INVALID_ARGUMENT);
}

TEST_CASE("sets registered differently on different ranks fail everywhere", "[process_set]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  // Rank 0 registers [0,1], every other rank [0]: every rank must see an error.
  std::vector<int> ranks = me == 0 ? std::vector<int>{0, 1} : std::vector<int>{0};
  int id = -1;
  Status s = addProcessSet(ranks, &id);
  INFO("rank " << me << ": addProcessSet(" << listText(ranks) << "): " << describe(s));
  CHECK(!s.ok());
  CHECK((s.code() == StatusCode::kMismatch || s.code() == StatusCode::kInvalidArgument));
  CHECK(!s.message().empty());
  // The runtime keeps working: a set registered the same way everywhere, used at once.
  int good = -1;
  s = addProcessSet({0, 1}, &good);
  INFO("then addProcessSet([0,1]): " << describe(s));
  REQUIRE(s.ok());
  if (me < 2) {
    exerciseSet(good, {0, 1}, "ps.after", "ps.after.global");
  } else {
    HostTensor g(DataType::kInt32, {3});
    fillInput(g, ReduceOp::kSum, me, 799);
    Handle h = 0;
    REQUIRE(allreduceAsync("ps.after.global", g.view(), g.view(), OpOptions(), &h).ok());
    CHECK(describe(waitFor(h)) == "kOk");
  }
  REQUIRE(removeProcessSet(good).ok());
}

TEST_CASE("sets added, used and removed again and again", "[process_set]") {
  requireInit();
  const int me = rank(), n = size();
  int first = -1;
  for (int cycle = 0; cycle < 8; ++cycle) {
    // Alternate between all ranks but the last (when there are two or more) and all ranks.
    std::vector<int> members;
    for (int r = 0; r < (n > 1 && cycle % 2 == 0 ? n - 1 : n); ++r) members.push_back(r);
    int set = -1;
    Status s = addProcessSet(members, &set);
    INFO("cycle " << cycle << ": addProcessSet(" << listText(members) << "): " << describe(s));
    REQUIRE(s.ok());
    // A removed set's id is given again (as Horovod does), here to members that change
    // from one cycle to the next: the transports must connect each set anew.
    if (cycle == 0) first = set;
    CHECK(set == first);
    if (std::find(members.begin(), members.end(), me) != members.end()) {
      HostTensor t(DataType::kInt32, {5}), x(DataType::kInt32, {5});
      fillInput(t, ReduceOp::kSum, me, 1500 + cycle);
      for (int64_t i = 0; i < 5; ++i) {
        std::vector<double> v;
        for (int r : members) v.push_back(inputValue(DataType::kInt32, ReduceOp::kSum, r, 1500 + cycle, i));
        x.set(i, referenceReduce(DataType::kInt32, ReduceOp::kSum, v, 1, 1, static_cast<int>(members.size())));
      }
      OpOptions o;
      o.process_set = set;
      Handle h = 0;
      REQUIRE(allreduceAsync("cycle", t.view(), t.view(), o, &h).ok());
      CHECK(describe(waitFor(h)) == "kOk");
      CHECK(compare(x, t.data(), 5, "cycle in set " + std::to_string(set)) == "");
    }
    REQUIRE(removeProcessSet(set).ok());
  }
}

TEST_CASE("a mismatch inside a set fails its members only", "[process_set][mismatch]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 3) {
    SUCCEED("needs a set of two ranks and a rank outside it");
    return;
  }
  int set = -1;
  REQUIRE(addProcessSet({0, 1}, &set).ok());
  HostTensor t(DataType::kFloat32, {8});
  t.fill(1.0);
  Handle h = 0;
  if (me < 2) {
    TensorView v = t.view();
    if (me == 1) v.shape = {7};
    OpOptions o;
    o.process_set = set;
    REQUIRE(allreduceAsync("setmm", v, v, o, &h).ok());
    Status s = waitFor(h);
    INFO("rank " << me << " in set [0,1], rank 1 deviates: " << describe(s));
    CHECK(s.code() == StatusCode::kMismatch);
    CHECK(s.message().find("setmm") != std::string::npos);
  } else {
    CHECK(processSetRank(set) == -1);
  }
  // Everyone continues with a correct global op.
  HostTensor g(DataType::kInt32, {2}), gx(DataType::kInt32, {2});
  g.fill(me);
  gx.fill(n * (n - 1) / 2);
  REQUIRE(allreduceAsync("setmm.after", g.view(), g.view(), OpOptions(), &h).ok());
  CHECK(describe(waitFor(h)) == "kOk");
  CHECK(compare(gx, g.data(), 2, "setmm.after") == "");
  REQUIRE(removeProcessSet(set).ok());
}
