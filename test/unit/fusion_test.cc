#include "core/fusion.h"

#include "test/catch.h"

using namespace tutti;

namespace {
Response allreduce(const std::string& name, int64_t count, DataType dtype = DataType::kFloat32) {
  Response r;
  r.names = {name};
  r.counts = {count};
  r.dtype = dtype;
  return r;
}
}  // namespace

TEST_CASE("fusion packs same-kind allreduces up to the threshold and keeps order") {
  std::vector<Response> in = {allreduce("a", 10), allreduce("b", 10, DataType::kInt32),
                              allreduce("c", 10), allreduce("d", 30), allreduce("e", 5)};
  in[1].dtype = DataType::kInt32;
  auto out = planFusion(in, 100);  // 25 floats fit
  REQUIRE(out.size() == 3);
  CHECK(out[0].names == std::vector<std::string>{"a", "c", "e"});
  CHECK(out[0].counts == std::vector<int64_t>{10, 10, 5});
  CHECK(out[1].names == std::vector<std::string>{"b"});
  CHECK(out[2].names == std::vector<std::string>{"d"});
}

TEST_CASE("fusion never merges different ops, scales, errors or CUDA tensors") {
  std::vector<Response> in(6, allreduce("x", 1));
  for (size_t i = 0; i < in.size(); ++i) in[i].names = {std::string(1, char('a' + i))};
  in[1].reduce_op = ReduceOp::kMax;
  in[2].prescale = 2;
  in[3].type = ResponseType::kError;
  in[4].device = DeviceType::kCuda;
  in[5].op = OpType::kBroadcast;
  auto out = planFusion(in, 1 << 20);
  CHECK(out.size() == 6);
}

TEST_CASE("threshold 0 disables fusion and the plan is deterministic") {
  std::vector<Response> in = {allreduce("a", 1), allreduce("b", 1)};
  CHECK(planFusion(in, 0).size() == 2);
  auto p1 = planFusion(in, 1024), p2 = planFusion(in, 1024);
  REQUIRE(p1.size() == 1);
  CHECK(p1[0].names == p2[0].names);
}

TEST_CASE("the fusion buffer grows and is reused") {
  FusionBuffer buffer;
  void* a = buffer.reserve(100);
  CHECK(buffer.capacity() >= 100);
  CHECK(buffer.reserve(50) == a);
  buffer.reserve(1 << 20);
  CHECK(buffer.capacity() >= (1u << 20));
}

#include "core/response_cache.h"

TEST_CASE("the response cache keys on what the ranks agreed on, with deterministic LRU") {
  ResponseCache cache(2);
  Request a;
  a.name = "a";
  a.shape = {4};
  Response ra;
  ra.names = {"a"};
  cache.put(a, ra);
  CHECK(cache.lookup(a) >= 0);
  Request other_root = a;
  other_root.root = 3;  // ignored by allreduce: still a hit
  CHECK(cache.lookup(other_root) == cache.lookup(a));
  Request other_shape = a;
  other_shape.shape = {5};
  CHECK(cache.lookup(other_shape) == -1);
  Request grouped = a;
  grouped.group = "g";
  CHECK(cache.lookup(grouped) == -1);
  Request b = a, c = a;
  b.name = "b";
  c.name = "c";
  cache.put(b, ra);
  cache.touch(cache.lookup(a));  // a is now more recent than b
  cache.put(c, ra);              // evicts b
  CHECK(cache.lookup(a) >= 0);
  CHECK(cache.lookup(b) == -1);
  CHECK(cache.lookup(c) >= 0);
  ResponseCache off(0);
  off.put(a, ra);
  CHECK(off.lookup(a) == -1);
}

TEST_CASE("the response cache holds one slot per name and compares the signature field by field") {
  ResponseCache cache(4);
  Request a;
  a.name = "a";
  a.shape = {4};
  Response ra;
  ra.names = {"a"};
  REQUIRE(cache.put(a, ra) == -1);
  const int slot = cache.lookup(a);
  REQUIRE(slot >= 0);
  int stale = 7;
  CHECK(cache.lookup(a, &stale) == slot);
  CHECK(stale == -1);
  // Each field the coordinator checks, changed alone: a miss that names the name's slot.
  std::vector<std::pair<const char*, Request>> changed;
  auto with = [&](const char* what, auto change) {
    Request q = a;
    change(q);
    changed.emplace_back(what, q);
  };
  with("dtype", [](Request& q) { q.dtype = DataType::kFloat64; });
  with("device", [](Request& q) { q.device = DeviceType::kCuda; });
  with("reduce op", [](Request& q) { q.reduce_op = ReduceOp::kMax; });
  with("prescale", [](Request& q) { q.prescale = 0.5; });
  with("postscale", [](Request& q) { q.postscale = -0.0; });
  with("shape", [](Request& q) { q.shape = {2, 2}; });
  with("group", [](Request& q) { q.group = "a/2"; q.group_size = 2; });
  with("op", [](Request& q) { q.op = OpType::kBroadcast; });
  with("uncached op", [](Request& q) { q.op = OpType::kAllgather; });
  for (auto& [what, q] : changed) {
    INFO(what);
    stale = -1;
    CHECK(cache.lookup(q, &stale) == -1);
    CHECK(stale == slot);
  }
  Request other_group = a;  // the same size, another group's key
  other_group.group = "x/2";
  other_group.group_size = 2;
  Request grouped = a;
  grouped.group = "a/2";
  grouped.group_size = 2;
  REQUIRE(cache.put(grouped, ra) == slot);  // the name keeps its slot, the old entry goes
  CHECK(cache.lookup(grouped) == slot);
  CHECK(cache.lookup(a) == -1);
  CHECK(cache.lookup(other_group) == -1);
  // Broadcast: its root counts, its reduction fields do not.
  Request bc = a;
  bc.name = "bc";
  bc.op = OpType::kBroadcast;
  bc.root = 1;
  REQUIRE(cache.put(bc, ra) == -1);
  Request bc_scaled = bc;
  bc_scaled.prescale = 3.0;
  CHECK(cache.lookup(bc_scaled) == cache.lookup(bc));
  Request bc_root = bc;
  bc_root.root = 0;
  CHECK(cache.lookup(bc_root) == -1);
  // A name never cached: no slot, nothing stale.
  Request none = a;
  none.name = "none";
  stale = 7;
  CHECK(cache.lookup(none, &stale) == -1);
  CHECK(stale == -1);
}

TEST_CASE("responseBytes counts what each op moves on this rank, allgather and alltoall included") {
  Response ar = allreduce("a", 10);
  ar.counts = {10, 6};  // fused
  CHECK(responseBytes(ar, 0, 2, 0) == 64);
  Response bc = allreduce("b", 8, DataType::kFloat64);
  bc.op = OpType::kBroadcast;
  CHECK(responseBytes(bc, 1, 2, 0) == 64);
  Response rs = allreduce("rs", 12, DataType::kInt16);
  rs.op = OpType::kReducescatter;
  CHECK(responseBytes(rs, 0, 3, 0) == 24);
  // Allgather: the gathered output, rows of every rank times this rank's row.
  Response ag;
  ag.op = OpType::kAllgather;
  ag.names = {"ag"};
  ag.dtype = DataType::kFloat32;
  ag.first_dims = {2, 0, 5};
  CHECK(responseBytes(ag, 1, 3, 4) == (2 + 0 + 5) * 4 * 4);
  // Alltoall: splits[from * n + to] rows; rank 1 sends 1 + 0 + 2 rows and receives
  // 3 + 0 + 4, rows of 2 int64.
  Response aa;
  aa.op = OpType::kAlltoall;
  aa.names = {"aa"};
  aa.dtype = DataType::kInt64;
  aa.splits = {9, 3, 9, 1, 0, 2, 9, 4, 9};
  CHECK(responseBytes(aa, 1, 3, 2) == 7 * 2 * 8);
  CHECK(responseBytes(aa, 1, 2, 2) == 0);  // splits not n x n: nothing trusted
  Response err = ar;
  err.type = ResponseType::kError;
  CHECK(responseBytes(err, 0, 2, 0) == 0);
  Response huge = ag;
  huge.first_dims = {int64_t(1) << 62, int64_t(1) << 62};
  CHECK(responseBytes(huge, 0, 2, 4) == INT64_MAX);
  Response barrier;
  barrier.op = OpType::kBarrier;
  barrier.names = {"b"};
  CHECK(responseBytes(barrier, 0, 2, 0) == 0);
}
