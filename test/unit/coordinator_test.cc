#include "core/coordinator.h"

#include "test/catch.h"

#include <algorithm>
#include <cmath>

using namespace tutti;

namespace {

Request req(const std::string& name, OpType op = OpType::kAllreduce, std::vector<int64_t> shape = {4, 8}) {
  Request q;
  q.name = name;
  q.op = op;
  q.shape = std::move(shape);
  return q;
}

std::vector<std::string> names(const std::vector<Response>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    for (const auto& n : r.names) out.push_back(n);
  return out;
}

Response decide(int size, const std::vector<Request>& per_rank) {
  Coordinator c(size);
  for (int r = 0; r < size; ++r) c.addRequests(r, {per_rank[r]}, Clock::now());
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 1);
  return ready[0];
}

}  // namespace

TEST_CASE("a name is ready once every rank has submitted it, in decision order") {
  Coordinator c(3);
  auto now = Clock::now();
  c.addRequests(0, {req("a"), req("b"), req("c")}, now);
  c.addRequests(1, {req("c"), req("a")}, now);
  CHECK(c.takeReady().empty());
  c.addRequests(2, {req("b"), req("a")}, now);
  CHECK(names(c.takeReady()) == std::vector<std::string>{"a"});
  CHECK(c.hasPending());
  c.addRequests(1, {req("b")}, now);
  c.addRequests(2, {req("c")}, now);
  CHECK(names(c.takeReady()) == std::vector<std::string>{"b", "c"});
  CHECK_FALSE(c.hasPending());
}

TEST_CASE("a world of one decides at once") {
  Coordinator c(1);
  c.addRequests(0, {req("x"), req("y", OpType::kBroadcast)}, Clock::now());
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 2);
  CHECK(ready[0].counts == std::vector<int64_t>{32});
  CHECK(ready[1].op == OpType::kBroadcast);
}

TEST_CASE("every mismatch kind becomes an error naming the tensor, the field and the ranks") {
  auto mismatch = [](Request a, Request b) {
    Response r = decide(2, {a, b});
    CHECK(r.type == ResponseType::kError);
    CHECK(r.error_code == StatusCode::kMismatch);
    return r.error_message;
  };
  Request a = req("grad/w1");
  Request b = a;
  b.shape = {4, 9};
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': shape [4,8] on rank 0 but [4,9] on rank 1");
  b = a;
  b.dtype = DataType::kInt32;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': dtype float32 on rank 0 but int32 on rank 1");
  b = a;
  b.op = OpType::kBroadcast;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': op allreduce on rank 0 but broadcast on rank 1");
  b = a;
  b.reduce_op = ReduceOp::kMax;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': reduce op sum on rank 0 but max on rank 1");
  b = a;
  b.prescale = 2;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': prescale 1 on rank 0 but 2 on rank 1");
  b = a;
  b.postscale = 0.5;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': postscale 1 on rank 0 but 0.5 on rank 1");
  b = a;
  b.device = DeviceType::kCuda;
  CHECK(mismatch(a, b) == "allreduce 'grad/w1': device cpu on rank 0 but cuda on rank 1");
  Request bc = req("w", OpType::kBroadcast);
  Request bc1 = bc;
  bc1.root = 1;
  CHECK(mismatch(bc, bc1) == "broadcast 'w': root 0 on rank 0 but 1 on rank 1");
  Request ag = req("g", OpType::kAllgather, {2, 3});
  Request ag1 = req("g", OpType::kAllgather, {5, 4});
  CHECK(mismatch(ag, ag1) ==
        "allgather 'g': trailing dimensions (all but the first) of shape [2,3] on rank 0 but "
        "[5,4] on rank 1");
  Request ps = req("p", OpType::kAddProcessSet, {});
  ps.splits = {0, 1};
  Request ps1 = ps;
  ps1.splits = {0};
  CHECK(mismatch(ps, ps1) == "add_process_set 'p': ranks [0, 1] on rank 0 but [0] on rank 1");
}

TEST_CASE("allgather, alltoall and reducescatter carry what every rank needs") {
  Request g0 = req("g", OpType::kAllgather, {2, 3}), g1 = req("g", OpType::kAllgather, {0, 3});
  Response r = decide(2, {g0, g1});
  CHECK(r.type == ResponseType::kOp);
  CHECK(r.first_dims == std::vector<int64_t>{2, 0});
  Request t0 = req("t", OpType::kAlltoall, {3}), t1 = req("t", OpType::kAlltoall, {1});
  t0.splits = {1, 2};
  t1.splits = {0, 1};
  r = decide(2, {t0, t1});
  CHECK(r.splits == std::vector<int64_t>{1, 2, 0, 1});
}

static Request joinRequest() {
  Request join;
  join.op = OpType::kJoin;
  join.name = "join.0";
  return join;
}

TEST_CASE("join: joined ranks count as submitted for allreduce, other ops fail, last rank reported") {
  Coordinator c(3);
  auto now = Clock::now();
  const Request join = joinRequest();
  c.addRequests(1, {req("a")}, now);
  c.addRequests(2, {join}, now);
  CHECK(c.takeReady().empty());
  c.addRequests(0, {req("a"), req("g", OpType::kAllgather, {1})}, now);
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 2);
  CHECK(ready[0].type == ResponseType::kOp);
  CHECK(ready[0].counts == std::vector<int64_t>{32});
  // The allgather fails for rank 0 at once, without waiting for rank 1's.
  CHECK(ready[1].type == ResponseType::kError);
  CHECK(ready[1].error_code == StatusCode::kJoined);
  CHECK(ready[1].error_message.find("rank(s) 2 have joined") != std::string::npos);
  c.addRequests(1, {req("g", OpType::kAllgather, {1})}, now);
  ready = c.takeReady();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].error_code == StatusCode::kJoined);
  c.addRequests(0, {join}, now);
  CHECK(c.takeReady().empty());
  c.addRequests(1, {join}, now);
  ready = c.takeReady();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].op == OpType::kJoin);
  CHECK(ready[0].value == 1);
  CHECK_FALSE(c.hasPending());
}

TEST_CASE("join at 3 ranks: an op other than allreduce fails even when its names differ") {
  // The joined rank skipped an unnamed allgather in an earlier round, so the other two
  // ranks' counters (and names) differ now: each must still get its error, not wait.
  Coordinator c(3);
  auto now = Clock::now();
  const Request join = joinRequest();
  c.addRequests(1, {join}, now);
  c.addRequests(0, {req("allgather.noname.3", OpType::kAllgather, {1})}, now);
  c.addRequests(2, {req("allgather.noname.4", OpType::kAllgather, {1})}, now);
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 2);
  for (const auto& r : ready) {
    CHECK(r.type == ResponseType::kError);
    CHECK(r.error_code == StatusCode::kJoined);
    CHECK(r.error_message.find("rank(s) 1 have joined") != std::string::npos);
  }
  c.addRequests(0, {join}, now);
  c.addRequests(2, {join}, now);
  ready = c.takeReady();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].op == OpType::kJoin);
  CHECK(ready[0].value == 2);
  CHECK_FALSE(c.hasPending());
}

TEST_CASE("a grouped allreduce is released only when every member is ready") {
  Coordinator c(2);
  auto now = Clock::now();
  auto grouped = [](const std::string& name) {
    Request q = req(name);
    q.group = "G";
    q.group_size = 2;
    return q;
  };
  c.addRequests(0, {grouped("x"), grouped("y")}, now);
  c.addRequests(1, {grouped("x")}, now);
  CHECK(c.takeReady().empty());
  c.addRequests(1, {grouped("y")}, now);
  CHECK(names(c.takeReady()) == std::vector<std::string>{"x", "y"});
}

TEST_CASE("grouped differently on two ranks: every tensor of both groups fails, none waits") {
  auto group = [](std::vector<std::string> names) {
    std::vector<Request> out;
    for (const auto& n : names) {
      Request q = req(n);
      q.group = names[0] + "/" + std::to_string(names.size());
      q.group_size = static_cast<int32_t>(names.size());
      out.push_back(q);
    }
    return out;
  };
  auto now = Clock::now();
  for (int larger = 0; larger < 2; ++larger) {  // the larger group on rank 0, then on rank 1
    for (int first = 0; first < 2; ++first) {    // which rank's requests arrive first
      INFO("larger group on rank " << larger << ", rank " << first << " first");
      Coordinator c(2);
      std::vector<std::vector<Request>> by_rank(2);
      by_rank[larger] = group({"a", "b", "c"});
      by_rank[1 - larger] = group({"a", "b"});
      c.addRequests(first, by_rank[first], now);
      c.addRequests(1 - first, by_rank[1 - first], now);
      auto ready = c.takeReady();
      std::vector<std::string> got = names(ready);
      std::sort(got.begin(), got.end());
      CHECK(got == std::vector<std::string>{"a", "b", "c"});
      for (const auto& r : ready) {
        CHECK(r.type == ResponseType::kError);
        CHECK(r.error_code == StatusCode::kMismatch);
        const std::string sizes = "group size " + std::to_string(larger == 0 ? 3 : 2) +
                                  " on rank 0 but " + std::to_string(larger == 0 ? 2 : 3) +
                                  " on rank 1";
        CHECK(r.error_message.find(sizes) != std::string::npos);
      }
      CHECK_FALSE(c.hasPending());
      CHECK(c.stalled(now + std::chrono::hours(1), 0).empty());
    }
  }
  // Grouped on one rank, alone on the other: the group's other tensor fails too.
  Coordinator c(2);
  c.addRequests(0, {req("a")}, now);
  c.addRequests(1, group({"a", "b"}), now);
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 2);
  CHECK(ready[0].error_message == "allreduce 'a': group size 1 on rank 0 but 2 on rank 1");
  CHECK(ready[1].names == std::vector<std::string>{"b"});
  CHECK(ready[1].error_message ==
        "allreduce 'b' (in a group of 2 on rank 1): its group cannot run: allreduce 'a': "
        "group size 1 on rank 0 but 2 on rank 1");
  CHECK_FALSE(c.hasPending());
  // The next step, grouped alike, runs.
  c.addRequests(0, group({"a", "b"}), now);
  c.addRequests(1, group({"a", "b"}), now);
  ready = c.takeReady();
  REQUIRE(ready.size() == 2);
  CHECK(ready[0].type == ResponseType::kOp);
  CHECK(ready[1].type == ResponseType::kOp);
}

TEST_CASE("scale factors: NaN equals NaN, and values that differ are printed apart") {
  Request a = req("s");
  Request b = a;
  a.prescale = b.prescale = std::nan("");
  CHECK(decide(2, {a, b}).type == ResponseType::kOp);
  a.postscale = 0.1;
  b.postscale = 0.1 + 2e-16;  // differs in the 16th digit
  Response r = decide(2, {a, b});
  CHECK(r.error_message ==
        "allreduce 's': postscale 0.1 on rank 0 but 0.1000000000000002 on rank 1");
  b.postscale = std::nan("");
  CHECK(decide(2, {a, b}).error_message ==
        "allreduce 's': postscale 0.1 on rank 0 but nan on rank 1");
  a.postscale = b.postscale = 1;
  b.prescale = 1.0 / 3;
  CHECK(decide(2, {a, b}).error_message ==
        "allreduce 's': prescale nan on rank 0 but 0.3333333333333333 on rank 1");
}

TEST_CASE("stalled names report the missing ranks") {
  Coordinator c(4);
  auto then = Clock::now() - std::chrono::seconds(10);
  c.addRequests(0, {req("slow")}, then);
  c.addRequests(2, {req("slow")}, then);
  auto stalled = c.stalled(Clock::now(), 5);
  REQUIRE(stalled.size() == 1);
  CHECK(stalled[0].name == "slow");
  CHECK(stalled[0].missing_ranks == std::vector<int>{1, 3});
  CHECK(c.stalled(Clock::now(), 60).empty());
}
