// Steady state across real processes: the same names step after step (the response cache),
// cached names whose description changes (on all ranks: must be renegotiated; on one rank:
// must be a mismatch), sizes around backend chunk boundaries, and every op at >= 16 MiB.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

using namespace tutti;
using namespace tutti::itest;

namespace {

struct Op {
  std::string name;
  DataType dtype;
  ReduceOp op;
  int64_t count;
  double pre = 1.0, post = 1.0;
};

// Submits allreduces of `ops` on this rank, in the order given by `order`, then waits and
// checks them all. `seed` makes every step's values different.
void runStep(const std::vector<Op>& ops, const std::vector<size_t>& order, uint64_t seed,
             const std::string& what) {
  const int me = rank(), n = size();
  std::vector<HostTensor> ins(ops.size()), xs(ops.size());
  std::vector<Handle> hs(ops.size(), 0);
  for (size_t k : order) {
    const Op& o = ops[k];
    const uint64_t s = seed * 131 + k;
    ins[k] = HostTensor(o.dtype, {o.count});
    xs[k] = HostTensor(o.dtype, {o.count});
    fillInput(ins[k], o.op, me, s);
    std::vector<double> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < o.count; ++i) {
      for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = inputValue(o.dtype, o.op, r, s, i);
      xs[k].set(i, referenceReduce(o.dtype, o.op, all, o.pre, o.post, n));
    }
    OpOptions opt;
    opt.op = o.op;
    opt.prescale = o.pre;
    opt.postscale = o.post;
    Status st = allreduceAsync(o.name, ins[k].view(), ins[k].view(), opt, &hs[k]);
    INFO(what << ": submit " << o.name << ": " << describe(st));
    REQUIRE(st.ok());
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    INFO("rank " << me << " of " << n << ", " << what << ", '" << ops[k].name << "'");
    CHECK(describe(waitFor(hs[k])) == "kOk");
    CHECK(compare(xs[k], ins[k].data(), ops[k].count, ops[k].name) == "");
  }
}

std::vector<size_t> rotated(size_t count, size_t by) {
  std::vector<size_t> order;
  for (size_t i = 0; i < count; ++i) order.push_back((i + by) % count);
  return order;
}

}  // namespace

TEST_CASE("the same names step after step, in a different order per rank", "[steady]") {
  requireInit();
  const std::vector<Op> ops = {
      {"w/a", DataType::kFloat32, ReduceOp::kAverage, 1000},
      {"w/b", DataType::kFloat32, ReduceOp::kSum, 1},
      {"w/c", DataType::kBFloat16, ReduceOp::kSum, 333},
      {"w/d", DataType::kInt64, ReduceOp::kMax, 17},
      {"w/e", DataType::kFloat16, ReduceOp::kAverage, 64, 0.5, 2.0},
      {"w/f", DataType::kUInt8, ReduceOp::kMin, 5},
      {"w/g", DataType::kBool, ReduceOp::kProduct, 9},
      {"w/h", DataType::kFloat64, ReduceOp::kProduct, 0}};
  for (int step = 0; step < 30; ++step)
    runStep(ops, rotated(ops.size(), static_cast<size_t>(rank() * 3 + step)),
            static_cast<uint64_t>(step), "step " + std::to_string(step));
}

TEST_CASE("a cached name described differently on all ranks is renegotiated", "[steady]") {
  requireInit();
  const std::vector<Op> variants = {
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8},
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8},
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8},
      {"cached.x", DataType::kInt32, ReduceOp::kMax, 8},           // dtype and op
      {"cached.x", DataType::kInt32, ReduceOp::kMax, 8},
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8, 2.0, 1.0},  // prescale
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8, 1.0, 0.5},  // postscale
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 5},             // shape
      {"cached.x", DataType::kFloat32, ReduceOp::kAverage, 5},         // op
      {"cached.x", DataType::kFloat32, ReduceOp::kSum, 8}};
  for (size_t v = 0; v < variants.size(); ++v)
    runStep({variants[v]}, {0}, 40 + v, "variant " + std::to_string(v));
}

TEST_CASE("a cached name that one rank changes is a mismatch on every rank", "[steady]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  const Op base = {"cached.mm", DataType::kFloat32, ReduceOp::kSum, 8};
  const char* kinds[] = {"shape", "dtype", "op", "prescale", "optype"};
  for (const char* kind : kinds) {
    for (int step = 0; step < 3; ++step) runStep({base}, {0}, 60 + step, "warm-up");
    HostTensor t(DataType::kFloat32, {16});
    t.fill(1.0);
    TensorView v = t.view();
    v.shape = {8};
    OpOptions o;
    Handle h = 0;
    const bool deviant = me == n - 1;
    const std::string k = kind;
    Status s;
    if (deviant && k == "shape") v.shape = {9};
    if (deviant && k == "dtype") v.dtype = DataType::kInt32;
    if (deviant && k == "op") o.op = ReduceOp::kMin;
    if (deviant && k == "prescale") o.prescale = 3.0;
    if (deviant && k == "optype") {
      s = broadcastAsync(base.name, v, o, &h);
    } else {
      s = allreduceAsync(base.name, v, v, o, &h);
    }
    REQUIRE(s.ok());
    s = waitFor(h);
    INFO("rank " << me << ": cached 'cached.mm', rank " << n - 1 << " changes its " << kind
                 << ": " << describe(s));
    CHECK(s.code() == StatusCode::kMismatch);
    CHECK(s.message().find("cached.mm") != std::string::npos);
    runStep({base}, {0}, 70, std::string("after the ") + kind + " mismatch");
  }
}

TEST_CASE("allreduce sizes around chunk boundaries", "[steady][medium]") {
  requireInit();
  const std::vector<Op> ops = {
      {"mid.f32.a", DataType::kFloat32, ReduceOp::kSum, 65535},
      {"mid.f32.b", DataType::kFloat32, ReduceOp::kSum, 65537},
      {"mid.f32.c", DataType::kFloat32, ReduceOp::kAverage, 262143},
      {"mid.f32.d", DataType::kFloat32, ReduceOp::kSum, (1 << 20) + 1},
      {"mid.bf16", DataType::kBFloat16, ReduceOp::kSum, 131073},
      {"mid.f16", DataType::kFloat16, ReduceOp::kMax, 131071},
      {"mid.i8", DataType::kInt8, ReduceOp::kMin, 1000003},
      {"mid.bool", DataType::kBool, ReduceOp::kSum, 300001}};
  runStep(ops, rotated(ops.size(), static_cast<size_t>(rank())), 99, "medium sizes");
}

TEST_CASE("broadcast, allgather, reducescatter and alltoall of >= 16 MiB", "[large]") {
  requireInit();
  const int me = rank(), n = size();
  const DataType d = DataType::kFloat32;
  const int64_t kBig = (4ll << 20) + 1;  // one element over 16 MiB of float32
  // broadcast from the last rank
  HostTensor bc(d, {kBig}), bc_x(d, {kBig});
  fillInput(bc, ReduceOp::kSum, me, 1);
  fillInput(bc_x, ReduceOp::kSum, n - 1, 1);
  // allgather: about 16 MiB in all, rank r contributing (4M + 2r + 1) / size rows
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (int r = 0; r < n; ++r) rows.push_back(((4ll << 20) + 2 * r + 1) / n), total += rows.back();
  HostTensor ag(d, {rows[static_cast<size_t>(me)]}), ag_x(d, {total});
  fillInput(ag, ReduceOp::kSum, me, 2);
  for (int r = 0, at = 0; r < n; ++r)
    for (int64_t i = 0; i < rows[static_cast<size_t>(r)]; ++i)
      ag_x.set(at++, inputValue(d, ReduceOp::kSum, r, 2, i));
  // reducescatter (sum) of kBig rows
  HostTensor rs(d, {kBig});
  fillInput(rs, ReduceOp::kSum, me, 3);
  const int64_t base = kBig / n, extra = kBig % n;
  const int64_t mine = base + (me < extra ? 1 : 0), first = me * base + std::min<int64_t>(me, extra);
  HostTensor rs_x(d, {mine});
  std::vector<double> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < mine; ++i) {
    for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = inputValue(d, ReduceOp::kSum, r, 3, first + i);
    rs_x.set(i, referenceReduce(d, ReduceOp::kSum, all, 1, 1, n));
  }
  // alltoall: rank r sends (4M / size^2) + j + r rows to rank j
  auto sends = [&](int r, int j) { return (4ll << 20) / (n * n) + j + r; };
  int64_t send_rows = 0, recv_rows = 0;
  OpOptions a2o;
  for (int j = 0; j < n; ++j) a2o.splits.push_back(sends(me, j)), send_rows += sends(me, j);
  for (int r = 0; r < n; ++r) recv_rows += sends(r, me);
  HostTensor a2a(d, {send_rows}), a2a_x(d, {recv_rows});
  fillInput(a2a, ReduceOp::kSum, me, 4);
  for (int r = 0, at = 0; r < n; ++r) {
    int64_t offset = 0;
    for (int j = 0; j < me; ++j) offset += sends(r, j);
    for (int64_t i = 0; i < sends(r, me); ++i)
      a2a_x.set(at++, inputValue(d, ReduceOp::kSum, r, 4, offset + i));
  }
  OpOptions bco;
  bco.root = n - 1;
  Handle hb = 0, ha = 0, hr = 0, ht = 0;
  REQUIRE(broadcastAsync("big.bc", bc.view(), bco, &hb).ok());
  REQUIRE(allgatherAsync("big.ag", ag.view(), OpOptions(), &ha).ok());
  REQUIRE(reducescatterAsync("big.rs", rs.view(), OpOptions(), &hr).ok());
  REQUIRE(alltoallAsync("big.a2a", a2a.view(), a2o, &ht).ok());
  INFO("rank " << me << " of " << n);
  CHECK(describe(waitFor(hb)) == "kOk");
  CHECK(compare(bc_x, bc.data(), kBig, "big.bc") == "");
  Result r;
  CHECK(describe(waitFor(ha, &r)) == "kOk");
  CHECK(compare(ag_x, r.data, r.nbytes / 4, "big.ag") == "");
  std::free(r.data);
  r = Result();
  CHECK(describe(waitFor(hr, &r)) == "kOk");
  CHECK(compare(rs_x, r.data, r.nbytes / 4, "big.rs") == "");
  std::free(r.data);
  r = Result();
  CHECK(describe(waitFor(ht, &r)) == "kOk");
  CHECK(compare(a2a_x, r.data, r.nbytes / 4, "big.a2a") == "");
  std::free(r.data);
}

TEST_CASE("cached allgather and alltoall names whose sizes change every step", "[steady]") {
  requireInit();
  const int me = rank(), n = size();
  const DataType d = DataType::kInt32;
  for (int step = 0; step < 12; ++step) {
    // allgather: rank r sends (r + step) % 3 rows of 2
    auto rowsOf = [&](int r) { return int64_t((r + step) % 3); };
    HostTensor ag(d, {rowsOf(me), 2});
    fillInput(ag, ReduceOp::kSum, me, 900 + step);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) total += rowsOf(r);
    HostTensor ag_x(d, {total, 2});
    for (int r = 0, at = 0; r < n; ++r)
      for (int64_t i = 0; i < rowsOf(r) * 2; ++i)
        ag_x.set(at++, inputValue(d, ReduceOp::kSum, r, 900 + step, i));
    // alltoall: rank r sends (r + j + step) % 3 rows to rank j
    auto sends = [&](int r, int j) { return int64_t((r + j + step) % 3); };
    OpOptions a2o;
    int64_t send_rows = 0, recv_rows = 0;
    for (int j = 0; j < n; ++j) a2o.splits.push_back(sends(me, j)), send_rows += sends(me, j);
    for (int r = 0; r < n; ++r) recv_rows += sends(r, me);
    HostTensor a2a(d, {send_rows}), a2a_x(d, {recv_rows});
    fillInput(a2a, ReduceOp::kSum, me, 950 + step);
    for (int r = 0, at = 0; r < n; ++r) {
      int64_t offset = 0;
      for (int j = 0; j < me; ++j) offset += sends(r, j);
      for (int64_t i = 0; i < sends(r, me); ++i)
        a2a_x.set(at++, inputValue(d, ReduceOp::kSum, r, 950 + step, offset + i));
    }
    Handle ha = 0, ht = 0;
    REQUIRE(allgatherAsync("cached.ag", ag.view(), OpOptions(), &ha).ok());
    REQUIRE(alltoallAsync("cached.a2a", a2a.view(), a2o, &ht).ok());
    INFO("rank " << me << " of " << n << ", step " << step);
    Result r;
    CHECK(describe(waitFor(ha, &r)) == "kOk");
    CHECK(listText(r.shape) == listText(ag_x.shape()));
    CHECK(compare(ag_x, r.data, r.nbytes / 4, "cached.ag") == "");
    std::free(r.data);
    r = Result();
    CHECK(describe(waitFor(ht, &r)) == "kOk");
    CHECK(listText(r.shape) == listText(a2a_x.shape()));
    CHECK(compare(a2a_x, r.data, r.nbytes / 4, "cached.a2a") == "");
    std::free(r.data);
  }
}

TEST_CASE("the same grouped allreduce step after step, next to single ones", "[steady][grouped]") {
  requireInit();
  const int n = size();
  for (int step = 0; step < 10; ++step) {
    std::vector<HostTensor> ins, xs;
    std::vector<std::string> names = {"sg/a", "sg/b", "sg/c"};
    const int64_t counts[] = {3, 100, 1};
    for (int k = 0; k < 3; ++k) {
      const uint64_t seed = 1200 + static_cast<uint64_t>(step * 3 + k);
      ins.emplace_back(DataType::kFloat32, std::vector<int64_t>{counts[k]});
      fillInput(ins.back(), ReduceOp::kAverage, rank(), seed);
      xs.emplace_back(DataType::kFloat32, std::vector<int64_t>{counts[k]});
      std::vector<double> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < counts[k]; ++i) {
        for (int r = 0; r < n; ++r)
          all[static_cast<size_t>(r)] = inputValue(DataType::kFloat32, ReduceOp::kAverage, r, seed, i);
        xs.back().set(i, referenceReduce(DataType::kFloat32, ReduceOp::kAverage, all, 1, 1, n));
      }
    }
    std::vector<TensorView> views;
    for (auto& t : ins) views.push_back(t.view());
    OpOptions o;
    o.op = ReduceOp::kAverage;
    Handle hg = 0;
    REQUIRE(groupedAllreduceAsync(names, views, views, o, &hg).ok());
    runStep({{"sg/single", DataType::kInt16, ReduceOp::kSum, 7}}, {0}, 1300 + step, "single");
    INFO("rank " << rank() << ", grouped step " << step);
    CHECK(describe(waitFor(hg)) == "kOk");
    for (int k = 0; k < 3; ++k) CHECK(compare(xs[k], ins[k].data(), counts[k], names[k]) == "");
  }
}
