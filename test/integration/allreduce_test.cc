// allreduce and grouped allreduce across real processes: every dtype x reduce op x count,
// scale factors, in place and out of place, submission order, fusion, unnamed ops, large.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <memory>
#include <set>
#include <sstream>

using namespace tutti;
using namespace tutti::itest;

namespace {

struct Pending {
  std::string name;
  HostTensor input, output, expected;
  bool in_place = false;
  Handle handle = 0;
};

std::vector<int64_t> sweepCounts(int size) {
  std::set<int64_t> counts = {0, 1, 7, 1023};
  for (int64_t c : {int64_t(size) - 1, int64_t(size) + 1, int64_t(64) * size - 1,
                    int64_t(64) * size + 1})
    if (c >= 0) counts.insert(c);
  return {counts.begin(), counts.end()};
}

uint64_t seedOf(DataType d, ReduceOp op, int64_t count, int extra) {
  return static_cast<uint64_t>(static_cast<int>(d) * 1000 + static_cast<int>(op) * 100 + extra) *
             100003ull + static_cast<uint64_t>(count);
}

// Builds input/expected for one allreduce of `count` elements on this rank.
std::unique_ptr<Pending> makeCase(const std::string& name, DataType d, ReduceOp op,
                                  int64_t count, bool in_place, double pre, double post,
                                  uint64_t seed) {
  const int me = rank(), n = size();
  auto p = std::make_unique<Pending>();
  p->name = name;
  p->in_place = in_place;
  p->input = HostTensor(d, {count});
  p->output = HostTensor(d, {count});
  p->expected = HostTensor(d, {count});
  fillInput(p->input, op, me, seed);
  std::vector<double> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < count; ++i) {
    for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = inputValue(d, op, r, seed, i);
    p->expected.set(i, referenceReduce(d, op, all, pre, post, n));
  }
  return p;
}

Status submit(Pending& p, ReduceOp op, double pre, double post) {
  OpOptions o;
  o.op = op;
  o.prescale = pre;
  o.postscale = post;
  TensorView in = p.input.view();
  TensorView out = p.in_place ? in : p.output.view();
  return allreduceAsync(p.name, in, out, o, &p.handle);
}

void finish(Pending& p) {
  Status s = waitFor(p.handle);
  INFO("rank " << rank() << " of " << size() << ", allreduce '" << p.name << "'");
  CHECK(describe(s) == "kOk");
  const void* got = p.in_place ? p.input.data() : p.output.data();
  CHECK(compare(p.expected, got, p.expected.numel(), p.name) == "");
}

const char* inPlaceName(bool in_place) { return in_place ? "inplace" : "outofplace"; }

}  // namespace

TEST_CASE("allreduce every dtype x reduce op x count, in and out of place", "[allreduce]") {
  requireInit();
  for (DataType d : allDataTypes()) {
    std::vector<std::unique_ptr<Pending>> pending;
    for (ReduceOp op : allReduceOps()) {
      if (d == DataType::kBool && op == ReduceOp::kAverage) continue;  // an error: see below
      for (int64_t count : sweepCounts(size())) {
        for (bool in_place : {false, true}) {
          std::ostringstream name;
          name << "ar." << dataTypeName(d) << "." << opName(op) << "." << count << "."
               << inPlaceName(in_place);
          pending.push_back(makeCase(name.str(), d, op, count, in_place, 1.0, 1.0,
                                     seedOf(d, op, count, in_place)));
          Status s = submit(*pending.back(), op, 1.0, 1.0);
          INFO("submit " << name.str() << ": " << describe(s));
          REQUIRE(s.ok());
        }
      }
    }
    for (auto& p : pending) finish(*p);
  }
}

TEST_CASE("allreduce one at a time, waiting for each", "[allreduce]") {
  requireInit();
  for (DataType d : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16}) {
    for (ReduceOp op : allReduceOps()) {
      for (int64_t count : {int64_t(0), int64_t(1), int64_t(size() + 1), int64_t(333)}) {
        std::string name = std::string("seq.") + dataTypeName(d) + "." + opName(op);
        auto p = makeCase(name, d, op, count, false, 1.0, 1.0, seedOf(d, op, count, 7));
        REQUIRE(submit(*p, op, 1.0, 1.0).ok());
        finish(*p);  // the same name is reused once the previous op has completed
      }
    }
  }
}

TEST_CASE("allreduce with prescale and postscale", "[allreduce][scale]") {
  requireInit();
  std::vector<std::unique_ptr<Pending>> pending;
  for (DataType d : allDataTypes()) {
    if (d == DataType::kBool) continue;
    // Integers: integral factors (truncation is then exact); floats: fractional ones.
    const double pre = isFloat(d) ? 0.5 : 2.0, post = 3.0;
    for (ReduceOp op : allReduceOps()) {
      if (!isFloat(d) && (op == ReduceOp::kAverage || op == ReduceOp::kProduct)) continue;
      for (bool in_place : {false, true}) {
        std::string name = std::string("scaled.") + dataTypeName(d) + "." + opName(op) +
                           "." + inPlaceName(in_place);
        pending.push_back(makeCase(name, d, op, 37, in_place, pre, post, seedOf(d, op, 37, 3)));
        REQUIRE(submit(*pending.back(), op, pre, post).ok());
      }
    }
  }
  for (auto& p : pending) finish(*p);
}

TEST_CASE("allreduce average of integers truncates toward zero", "[allreduce]") {
  requireInit();
  // Rank r contributes -(r*r + 2 + i): for sizes 2, 3 and 4 the sums are negative and not
  // multiples of the size, so truncation toward zero differs from flooring.
  HostTensor in(DataType::kInt32, {3}), expected(DataType::kInt32, {3});
  for (int i = 0; i < 3; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < size(); ++r) sum += -(r * r + 2 + i);
    in.set(i, -(rank() * rank() + 2 + i));
    expected.set(i, static_cast<double>(sum / size()));  // C++ division truncates
  }
  OpOptions o;
  o.op = ReduceOp::kAverage;
  Handle h = 0;
  REQUIRE(allreduceAsync("avg.trunc", in.view(), in.view(), o, &h).ok());
  Status s = waitFor(h);
  CHECK(describe(s) == "kOk");
  CHECK(compare(expected, in.data(), 3, "avg.trunc") == "");
}

TEST_CASE("grouped allreduce completes a list with one handle", "[allreduce][grouped]") {
  requireInit();
  for (DataType d : {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      std::vector<std::unique_ptr<Pending>> parts;
      std::vector<std::string> names;
      std::vector<TensorView> ins, outs;
      const std::vector<int64_t> counts = {0, 1, 5, int64_t(size()) + 1, 100};
      for (size_t k = 0; k < counts.size(); ++k) {
        bool in_place = k % 2 == 1;
        std::string name = std::string("group.") + dataTypeName(d) + "." + opName(op) +
                           "." + std::to_string(k);
        parts.push_back(makeCase(name, d, op, counts[k], in_place, 1.0, 1.0,
                                 seedOf(d, op, counts[k], static_cast<int>(k))));
        names.push_back(name);
        ins.push_back(parts.back()->input.view());
        outs.push_back(in_place ? parts.back()->input.view() : parts.back()->output.view());
      }
      OpOptions o;
      o.op = op;
      Handle h = 0;
      Status s = groupedAllreduceAsync(names, ins, outs, o, &h);
      INFO("grouped submit: " << describe(s));
      REQUIRE(s.ok());
      CHECK(h != 0);
      s = waitFor(h);
      CHECK(describe(s) == "kOk");
      for (auto& p : parts) {
        const void* got = p->in_place ? p->input.data() : p->output.data();
        INFO("rank " << rank() << " grouped part " << p->name);
        CHECK(compare(p->expected, got, p->expected.numel(), p->name) == "");
      }
    }
  }
}

TEST_CASE("tensors submitted in a different order on every rank", "[allreduce][order]") {
  requireInit();
  const int kTensors = 12;
  const DataType kTypes[] = {DataType::kFloat32, DataType::kInt16, DataType::kFloat64,
                             DataType::kUInt8, DataType::kBFloat16, DataType::kInt64};
  std::vector<std::unique_ptr<Pending>> pending(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    const int k = (i + rank() * 5) % kTensors;  // rotated differently on each rank
    DataType d = kTypes[k % 6];
    int64_t count = 1 + 17 * k;
    pending[static_cast<size_t>(k)] =
        makeCase("order." + std::to_string(k), d, ReduceOp::kSum, count, k % 3 == 0, 1.0, 1.0,
                 seedOf(d, ReduceOp::kSum, count, 11));
    REQUIRE(submit(*pending[static_cast<size_t>(k)], ReduceOp::kSum, 1.0, 1.0).ok());
  }
  // Wait in yet another order (reverse of submission on odd ranks).
  for (int i = 0; i < kTensors; ++i) {
    int k = rank() % 2 ? kTensors - 1 - i : i;
    finish(*pending[static_cast<size_t>(k)]);
  }
}

TEST_CASE("a fusion-sized batch of 200 small tensors", "[allreduce][fusion]") {
  requireInit();
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 200; ++i) {
    ReduceOp op = i % 4 == 0 ? ReduceOp::kAverage : ReduceOp::kSum;
    pending.push_back(makeCase("fuse." + std::to_string(i), DataType::kFloat32, op, 256 + i % 3,
                               i % 2 == 0, 1.0, 1.0, seedOf(DataType::kFloat32, op, 256, i)));
    REQUIRE(submit(*pending.back(), op, 1.0, 1.0).ok());
  }
  for (auto& p : pending) finish(*p);
}

TEST_CASE("unnamed allreduces issued in the same order on every rank", "[allreduce]") {
  requireInit();
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < 6; ++i) {
    pending.push_back(makeCase("", DataType::kInt32, ReduceOp::kSum, 10 + i, false, 1.0, 1.0,
                               seedOf(DataType::kInt32, ReduceOp::kSum, 10, i)));
    REQUIRE(submit(*pending.back(), ReduceOp::kSum, 1.0, 1.0).ok());
  }
  for (auto& p : pending) finish(*p);
}

TEST_CASE("allreduce through the C API, every dtype", "[allreduce][c_api]") {
  requireInit();
  for (DataType d : allDataTypes()) {
    const int64_t count = 33;
    const ReduceOp op = d == DataType::kBool ? ReduceOp::kMax : ReduceOp::kSum;
    auto p = makeCase(std::string("c.") + dataTypeName(d), d, op, count, false, 1.0, 1.0,
                      seedOf(d, op, count, 21));
    tutti_handle_t h = 0;
    tutti_status_t s = tutti_allreduce_async(p->name.c_str(), p->input.data(), p->output.data(),
                                             count, static_cast<tutti_dtype_t>(d),
                                             static_cast<tutti_reduce_op_t>(op), 1.0, 1.0, &h);
    INFO("tutti_allreduce_async: " << tutti_status_string(s) << " " << tutti_last_error());
    REQUIRE(s == TUTTI_OK);
    CHECK(h != 0);
    tutti_result_t res;
    res.struct_size = sizeof(res);
    res.data = &res;  // must be overwritten: allreduce has no Tutti-allocated output
    s = tutti_wait_result(h, kWaitSeconds, &res);
    CHECK(s == TUTTI_OK);
    CHECK(res.data == nullptr);
    CHECK(res.recv_splits == nullptr);
    CHECK(res.last_joined_rank == -1);
    CHECK(compare(p->expected, p->output.data(), count, p->name) == "");
  }
}

TEST_CASE("large allreduces (16 MiB)", "[allreduce][large]") {
  requireInit();
  // float32 sum, out of place, one element more than 16 MiB; int64 max in place, 16 MiB.
  auto a = makeCase("large.f32.sum", DataType::kFloat32, ReduceOp::kSum, (4ll << 20) + 1, false,
                    1.0, 1.0, 9001);
  auto b = makeCase("large.i64.max", DataType::kInt64, ReduceOp::kMax, 2ll << 20, true, 1.0,
                    1.0, 9002);
  REQUIRE(submit(*a, ReduceOp::kSum, 1.0, 1.0).ok());
  REQUIRE(submit(*b, ReduceOp::kMax, 1.0, 1.0).ok());
  finish(*a);
  finish(*b);
}
