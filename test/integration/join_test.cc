// join across real processes: ranks run out of data at different steps, joined ranks
// contribute zeros, average divides by the full size, the last joined rank is reported, and
// ops that cannot take zeros fail with kJoined while a rank has joined.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <algorithm>
#include <cstdlib>

using namespace tutti;
using namespace tutti::itest;

namespace {

std::vector<int> allRanks() {
  std::vector<int> v;
  for (int r = 0; r < size(); ++r) v.push_back(r);
  return v;
}

// One training-like step in process set `set` (world ranks `members`): a float32 sum and an
// int32 average over the members still active (steps[world rank] > s).
void step(const std::string& tag, int s, const std::vector<int>& steps, int set = 0,
          std::vector<int> members = {}) {
  if (members.empty()) members = allRanks();
  const int me = rank(), n = static_cast<int>(members.size());
  const uint64_t seed = 5000 + static_cast<uint64_t>(s);
  HostTensor f(DataType::kFloat32, {5}), fx(DataType::kFloat32, {5});
  HostTensor i(DataType::kInt32, {7}), ix(DataType::kInt32, {7});
  fillInput(f, ReduceOp::kSum, me, seed);
  fillInput(i, ReduceOp::kAverage, me, seed + 1);
  for (int64_t k = 0; k < 7; ++k) {
    std::vector<double> fs, is;
    for (int r : members) {
      bool active = steps[static_cast<size_t>(r)] > s;  // joined ranks contribute zeros
      fs.push_back(active ? inputValue(DataType::kFloat32, ReduceOp::kSum, r, seed, k) : 0.0);
      is.push_back(active ? inputValue(DataType::kInt32, ReduceOp::kAverage, r, seed + 1, k) : 0.0);
    }
    if (k < 5) fx.set(k, referenceReduce(DataType::kFloat32, ReduceOp::kSum, fs, 1, 1, n));
    ix.set(k, referenceReduce(DataType::kInt32, ReduceOp::kAverage, is, 1, 1, n));
  }
  OpOptions sum, avg;
  sum.process_set = avg.process_set = set;
  avg.op = ReduceOp::kAverage;
  Handle hf = 0, hi = 0;
  std::string name = tag + "." + std::to_string(s);
  REQUIRE(allreduceAsync(name + ".f", f.view(), f.view(), sum, &hf).ok());
  REQUIRE(allreduceAsync(name + ".i", i.view(), i.view(), avg, &hi).ok());
  INFO("rank " << me << " of " << n << ", step " << s << " of '" << tag << "'");
  CHECK(describe(waitFor(hf)) == "kOk");
  CHECK(describe(waitFor(hi)) == "kOk");
  CHECK(compare(fx, f.data(), 5, name + ".f") == "");
  CHECK(compare(ix, i.data(), 7, name + ".i") == "");
}

// Runs steps[rank] steps then joins; returns the last joined rank this rank was told.
int runAndJoin(const std::string& tag, const std::vector<int>& steps, bool c_api) {
  for (int s = 0; s < steps[static_cast<size_t>(rank())]; ++s) step(tag, s, steps);
  if (c_api) {
    int last = -2;
    tutti_status_t st = tutti_join(TUTTI_GLOBAL_PROCESS_SET, kWaitSeconds, &last);
    INFO("tutti_join: " << tutti_status_string(st) << " " << tutti_last_error());
    CHECK(st == TUTTI_OK);
    return last;
  }
  Handle h = 0;
  REQUIRE(joinAsync(TUTTI_GLOBAL_PROCESS_SET, &h).ok());
  Result r;
  Status s = waitFor(h, &r);
  CHECK(describe(s) == "kOk");
  return r.last_joined_rank;
}

}  // namespace

TEST_CASE("size-1 ranks join early, each at a different step", "[join]") {
  requireInit();
  const int n = size();
  for (int shift = 0; shift < std::min(n, 2); ++shift) {
    std::vector<int> steps;
    for (int r = 0; r < n; ++r) steps.push_back(1 + ((r + shift) % n) * 2);
    const int last = static_cast<int>(std::max_element(steps.begin(), steps.end()) - steps.begin());
    int got = runAndJoin("join.a" + std::to_string(shift), steps, shift == 1);
    INFO("rank " << rank() << ": steps per rank " << listText(steps));
    CHECK(got == last);
  }
}

TEST_CASE("one rank joins early while the others continue", "[join]") {
  requireInit();
  const int n = size();
  for (int early = 0; early < n; ++early) {
    std::vector<int> steps(static_cast<size_t>(n), 3);
    steps[static_cast<size_t>(early)] = 1;
    // The same names in every round: cached responses meet ranks that have joined.
    int got = runAndJoin("join.b", steps, false);
    INFO("rank " << rank() << ": rank " << early << " joined after 1 step, the others after 3");
    if (n == 1) {
      CHECK(got == 0);
    } else {
      CHECK(got != early);
      CHECK(got >= 0);
      CHECK(got < n);
    }
  }
}

TEST_CASE("allgather, broadcast, alltoall, reducescatter fail with kJoined", "[join]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 2) {
    SUCCEED("needs a rank that has joined and one that has not");
    return;
  }
  Handle join = 0;
  if (me == 0) {
    REQUIRE(joinAsync(TUTTI_GLOBAL_PROCESS_SET, &join).ok());
  } else {
    HostTensor t(DataType::kFloat32, {2ll * n});
    fillInput(t, ReduceOp::kSum, me, 1);
    Handle h[4] = {0, 0, 0, 0};
    REQUIRE(allgatherAsync("joined.ag", t.view(), OpOptions(), &h[0]).ok());
    OpOptions root1;
    root1.root = 1;
    REQUIRE(broadcastAsync("joined.bc", t.view(), root1, &h[1]).ok());
    REQUIRE(alltoallAsync("joined.a2a", t.view(), OpOptions(), &h[2]).ok());
    REQUIRE(reducescatterAsync("joined.rs", t.view(), OpOptions(), &h[3]).ok());
    const char* what[4] = {"allgather", "broadcast", "alltoall", "reducescatter"};
    for (int k = 0; k < 4; ++k) {
      Result r;
      Status s = waitFor(h[k], &r);
      INFO("rank " << me << ": " << what[k] << " while rank 0 has joined: " << describe(s));
      CHECK(s.code() == StatusCode::kJoined);
      CHECK(!s.message().empty());
      std::free(r.data);
    }
    REQUIRE(joinAsync(TUTTI_GLOBAL_PROCESS_SET, &join).ok());
  }
  Result r;
  CHECK(describe(waitFor(join, &r)) == "kOk");
  CHECK(r.last_joined_rank > 0);
  // After everyone joined the runtime is back to normal.
  step("joined.after", 0, std::vector<int>(static_cast<size_t>(n), 1));
}

TEST_CASE("join inside a process set", "[join][process_set]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 3) {
    SUCCEED("needs a set of two ranks besides another rank");
    return;
  }
  std::vector<int> evens;
  for (int r = 0; r < n; r += 2) evens.push_back(r);
  int set = -1;
  REQUIRE(addProcessSet(evens, &set).ok());
  if (me % 2 == 0) {
    // Rank 0 runs out of data after 1 step, the other members after 3 (set of 2 ranks).
    std::vector<int> steps(static_cast<size_t>(n), 3);
    steps[0] = 1;
    for (int s = 0; s < steps[static_cast<size_t>(me)]; ++s) step("setjoin", s, steps, set, evens);
    Handle h = 0;
    REQUIRE(joinAsync(set, &h).ok());
    Result r;
    CHECK(describe(waitFor(h, &r)) == "kOk");
    INFO("rank " << me << ": last joined in set " << listText(evens) << " (world rank "
                 << evens.back() << ", set rank " << evens.size() - 1 << "): " << r.last_joined_rank);
    CHECK(r.last_joined_rank != 0);
    CHECK((r.last_joined_rank == evens.back() ||
           r.last_joined_rank == static_cast<int>(evens.size()) - 1));
  }
  // Non-members were not held up; everyone meets again globally.
  step("setjoin.after", 0, std::vector<int>(static_cast<size_t>(n), 1));
  REQUIRE(removeProcessSet(set).ok());
}
