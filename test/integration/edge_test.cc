// Edge cases across real processes: scalars, zero-sized inner dimensions, grouped allreduce
// with mixed dtypes / a deviating member / repeated names, many threads submitting at once,
// thread-local last errors, unnamed ops of several types interleaved.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <atomic>
#include <cstdlib>
#include <thread>

using namespace tutti;
using namespace tutti::itest;

namespace {

// Expected allreduce of `count` elements for (dtype, op, seed) over all ranks.
HostTensor expectedReduce(DataType d, ReduceOp op, const std::vector<int64_t>& shape,
                          uint64_t seed) {
  HostTensor x(d, shape);
  std::vector<double> all(static_cast<size_t>(size()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    for (int r = 0; r < size(); ++r) all[static_cast<size_t>(r)] = inputValue(d, op, r, seed, i);
    x.set(i, referenceReduce(d, op, all, 1, 1, size()));
  }
  return x;
}

}  // namespace

TEST_CASE("scalars (empty shape) through allreduce and broadcast", "[edge]") {
  requireInit();
  HostTensor a(DataType::kFloat64, {}), b(DataType::kInt16, {});
  REQUIRE(a.numel() == 1);
  fillInput(a, ReduceOp::kSum, rank(), 3);
  fillInput(b, ReduceOp::kSum, rank(), 4);
  HostTensor ax = expectedReduce(DataType::kFloat64, ReduceOp::kSum, {}, 3);
  HostTensor bx(DataType::kInt16, {});
  fillInput(bx, ReduceOp::kSum, size() - 1, 4);
  Handle ha = 0, hb = 0;
  REQUIRE(allreduceAsync("scalar.ar", a.view(), a.view(), OpOptions(), &ha).ok());
  OpOptions o;
  o.root = size() - 1;
  REQUIRE(broadcastAsync("scalar.bc", b.view(), o, &hb).ok());
  CHECK(describe(waitFor(ha)) == "kOk");
  CHECK(describe(waitFor(hb)) == "kOk");
  CHECK(compare(ax, a.data(), 1, "scalar.ar") == "");
  CHECK(compare(bx, b.data(), 1, "scalar.bc") == "");
}

TEST_CASE("tensors with a zero-sized inner dimension", "[edge]") {
  requireInit();
  const int me = rank(), n = size();
  HostTensor ar(DataType::kFloat32, {3, 0, 2});
  Handle h = 0;
  REQUIRE(allreduceAsync("zero.ar", ar.view(), ar.view(), OpOptions(), &h).ok());
  CHECK(describe(waitFor(h)) == "kOk");
  // allgather of [me + 1, 0]: output [sum, 0], no bytes.
  HostTensor ag(DataType::kInt32, {me + 1, 0});
  REQUIRE(allgatherAsync("zero.ag", ag.view(), OpOptions(), &h).ok());
  Result r;
  CHECK(describe(waitFor(h, &r)) == "kOk");
  CHECK(listText(r.shape) == listText(std::vector<int64_t>{int64_t(n) * (n + 1) / 2, 0}));
  CHECK(r.nbytes == 0);
  std::free(r.data);
  // reducescatter of [2n + 1, 0]
  HostTensor rs(DataType::kInt32, {2 * n + 1, 0});
  REQUIRE(reducescatterAsync("zero.rs", rs.view(), OpOptions(), &h).ok());
  r = Result();
  CHECK(describe(waitFor(h, &r)) == "kOk");
  CHECK(listText(r.shape) == listText(std::vector<int64_t>{me == 0 ? 3 : 2, 0}));
  std::free(r.data);
}

TEST_CASE("grouped allreduce of mixed dtypes", "[edge][grouped]") {
  requireInit();
  const DataType types[] = {DataType::kFloat32, DataType::kInt32, DataType::kBFloat16,
                            DataType::kUInt8, DataType::kFloat64};
  std::vector<HostTensor> ins, xs;
  std::vector<std::string> names;
  for (int k = 0; k < 5; ++k) {
    ins.emplace_back(types[k], std::vector<int64_t>{11 + k});
    fillInput(ins.back(), ReduceOp::kMax, rank(), 200 + k);
    xs.push_back(expectedReduce(types[k], ReduceOp::kMax, {11 + k}, 200 + k));
    names.push_back("mixed." + std::to_string(k));
  }
  std::vector<TensorView> views;
  for (auto& t : ins) views.push_back(t.view());
  OpOptions o;
  o.op = ReduceOp::kMax;
  Handle h = 0;
  Status s = groupedAllreduceAsync(names, views, views, o, &h);
  INFO("grouped mixed dtypes: " << describe(s));
  REQUIRE(s.ok());
  CHECK(describe(waitFor(h)) == "kOk");
  for (int k = 0; k < 5; ++k) CHECK(compare(xs[k], ins[k].data(), 11 + k, names[k]) == "");
}

TEST_CASE("grouped allreduce with one deviating member is a mismatch everywhere", "[edge][grouped]") {
  requireInit();
  if (size() < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  std::vector<HostTensor> ins;
  for (int k = 0; k < 3; ++k) ins.emplace_back(DataType::kFloat32, std::vector<int64_t>{8});
  std::vector<TensorView> views;
  for (auto& t : ins) views.push_back(t.view());
  if (rank() == size() - 1) views[1].shape = {7};
  Handle h = 0;
  REQUIRE(groupedAllreduceAsync({"gmm.0", "gmm.1", "gmm.2"}, views, views, OpOptions(), &h).ok());
  Status s = waitFor(h);
  INFO("rank " << rank() << ": group whose 'gmm.1' differs on rank " << size() - 1 << ": "
               << describe(s));
  CHECK(s.code() == StatusCode::kMismatch);
  CHECK(s.message().find("gmm.1") != std::string::npos);
  // The same names work as a correct group right after.
  std::vector<HostTensor> again;
  std::vector<HostTensor> xs;
  views.clear();
  for (int k = 0; k < 3; ++k) {
    again.emplace_back(DataType::kFloat32, std::vector<int64_t>{8});
    fillInput(again.back(), ReduceOp::kSum, rank(), 300 + k);
    xs.push_back(expectedReduce(DataType::kFloat32, ReduceOp::kSum, {8}, 300 + k));
  }
  for (auto& t : again) views.push_back(t.view());
  REQUIRE(groupedAllreduceAsync({"gmm.0", "gmm.1", "gmm.2"}, views, views, OpOptions(), &h).ok());
  CHECK(describe(waitFor(h)) == "kOk");
  for (int k = 0; k < 3; ++k) CHECK(compare(xs[k], again[k].data(), 8, "gmm again") == "");
}

TEST_CASE("a grouped allreduce naming one tensor twice is rejected", "[edge][grouped]") {
  requireInit();
  HostTensor a(DataType::kFloat32, {4}), b(DataType::kFloat32, {4});
  Handle h = 0;
  Status s = groupedAllreduceAsync({"twice", "twice"}, {a.view(), b.view()},
                                   {a.view(), b.view()}, OpOptions(), &h);
  INFO(describe(s));
  CHECK((s.code() == StatusCode::kDuplicateName || s.code() == StatusCode::kInvalidArgument));
  // names/inputs/outputs of different lengths
  s = groupedAllreduceAsync({"len.0", "len.1"}, {a.view()}, {a.view()}, OpOptions(), &h);
  CHECK(s.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("four threads per rank submitting at once", "[edge][threads]") {
  requireInit();
  const int kThreads = 4, kOps = 40;
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<HostTensor> ins, xs;
      std::vector<Handle> hs;
      for (int i = 0; i < kOps; ++i) {
        const uint64_t seed = 1000 + static_cast<uint64_t>(t * kOps + i);
        const int64_t count = 1 + (t * 7 + i) % 50;
        ins.emplace_back(DataType::kInt32, std::vector<int64_t>{count});
        fillInput(ins.back(), ReduceOp::kSum, rank(), seed);
        xs.push_back(expectedReduce(DataType::kInt32, ReduceOp::kSum, {count}, seed));
        hs.push_back(0);
        std::string name = "thread." + std::to_string(t) + "." + std::to_string(i);
        Status s = allreduceAsync(name, ins.back().view(), ins.back().view(), OpOptions(), &hs.back());
        if (!s.ok()) {
          ++failures;
          errors[t] += name + ": " + describe(s) + "; ";
        }
        if (i % 10 == 9) {  // wait for a batch now and then, keep the rest in flight
          for (size_t k = hs.size() - 10; k < hs.size(); ++k) {
            Status w = hs[k] ? waitFor(hs[k]) : Status(StatusCode::kInternal, "not submitted");
            std::string c = compare(xs[k], ins[k].data(), xs[k].numel(), "thread op");
            if (!w.ok() || !c.empty()) {
              ++failures;
              errors[t] += describe(w) + " " + c + "; ";
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("rank " << rank() << " thread " << t << ": " << errors[t]);
    CHECK(errors[t].empty());
  }
  CHECK(failures.load() == 0);
}

TEST_CASE("tutti_last_error is per thread", "[edge][c_api]") {
  requireInit();
  float v = 1;
  tutti_handle_t h = 0;
  REQUIRE(tutti_allreduce_async("lasterr.main", &v, &v, -5, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h) ==
          TUTTI_ERR_INVALID_ARGUMENT);
  const std::string mine = tutti_last_error();
  CHECK(!mine.empty());
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = tutti_last_error();
    tutti_broadcast_async("lasterr.thread", &v, 1, TUTTI_FLOAT32, -7, &h);
    other_after = tutti_last_error();
  });
  t.join();
  CHECK(other_before.empty());
  CHECK(!other_after.empty());
  CHECK(other_after != mine);
  CHECK(std::string(tutti_last_error()) == mine);
}

TEST_CASE("unnamed ops of several types interleaved in the same order", "[edge]") {
  requireInit();
  const int n = size();
  HostTensor a1(DataType::kInt64, {4}), a2(DataType::kInt64, {4}), b1(DataType::kInt64, {3}),
      g1(DataType::kInt64, {2});
  fillInput(a1, ReduceOp::kSum, rank(), 501);
  fillInput(a2, ReduceOp::kSum, rank(), 502);
  fillInput(b1, ReduceOp::kSum, rank(), 503);
  fillInput(g1, ReduceOp::kSum, rank(), 504);
  HostTensor a1x = expectedReduce(DataType::kInt64, ReduceOp::kSum, {4}, 501);
  HostTensor a2x = expectedReduce(DataType::kInt64, ReduceOp::kSum, {4}, 502);
  HostTensor b1x(DataType::kInt64, {3});
  fillInput(b1x, ReduceOp::kSum, 0, 503);
  HostTensor g1x(DataType::kInt64, {2ll * n});
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 2; ++i) g1x.set(2 * r + i, inputValue(DataType::kInt64, ReduceOp::kSum, r, 504, i));
  Handle h[4];
  REQUIRE(allreduceAsync("", a1.view(), a1.view(), OpOptions(), &h[0]).ok());
  REQUIRE(broadcastAsync("", b1.view(), OpOptions(), &h[1]).ok());
  REQUIRE(allgatherAsync("", g1.view(), OpOptions(), &h[2]).ok());
  REQUIRE(allreduceAsync("", a2.view(), a2.view(), OpOptions(), &h[3]).ok());
  CHECK(describe(waitFor(h[0])) == "kOk");
  CHECK(describe(waitFor(h[1])) == "kOk");
  Result r;
  CHECK(describe(waitFor(h[2], &r)) == "kOk");
  CHECK(describe(waitFor(h[3])) == "kOk");
  CHECK(compare(a1x, a1.data(), 4, "unnamed allreduce 1") == "");
  CHECK(compare(b1x, b1.data(), 3, "unnamed broadcast") == "");
  CHECK(compare(g1x, r.data, r.nbytes / 8, "unnamed allgather") == "");
  CHECK(compare(a2x, a2.data(), 4, "unnamed allreduce 2") == "");
  std::free(r.data);
}

TEST_CASE("the launcher picks the backend", "[edge]") {
  requireInit();
  const char* forced = std::getenv("TUTTI_CPU_OPERATIONS");
  INFO("backend " << cpuBackend());
  if (forced && *forced) {
    CHECK(cpuBackend() == forced);
  } else if (std::getenv("TUTTI_RENDEZVOUS_ADDR")) {
    CHECK(cpuBackend() == "gloo");  // tuttirun --gloo
  } else if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    CHECK(cpuBackend() == "mpi");   // mpirun
  }
  CHECK(size() >= 1);
}
