// broadcast, allgather, alltoall, reducescatter and barrier across real processes, for every
// dtype, with uneven and zero-sized parts. References are computed locally on every rank.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <cstdlib>
#include <memory>
#include <set>

using namespace tutti;
using namespace tutti::itest;

namespace {

// A submitted op whose output comes back in a Result.
struct Pending {
  std::string name;
  HostTensor input, expected;
  std::vector<int64_t> expected_splits;  // alltoall
  Handle handle = 0;
};

void finishResult(Pending& p) {
  Result r;
  Status s = waitFor(p.handle, &r);
  INFO("rank " << rank() << " of " << size() << ": '" << p.name << "'");
  CHECK(describe(s) == "kOk");
  CHECK(listText(r.shape) == listText(p.expected.shape()));
  CHECK(r.nbytes == p.expected.nbytes());
  if (s.ok()) CHECK(compare(p.expected, r.data, p.expected.numel(), p.name) == "");
  if (!p.expected_splits.empty()) CHECK(listText(r.recv_splits) == listText(p.expected_splits));
  std::free(r.data);
}

uint64_t seedOf(DataType d, int a, int b) {
  return static_cast<uint64_t>(static_cast<int>(d) + 1) * 7919ull + static_cast<uint64_t>(a) * 131ull +
         static_cast<uint64_t>(b);
}

}  // namespace

TEST_CASE("broadcast every dtype from every root", "[broadcast]") {
  requireInit();
  const int me = rank(), n = size();
  for (DataType d : allDataTypes()) {
    std::vector<std::unique_ptr<Pending>> pending;
    for (int root = 0; root < n; ++root) {
      for (int64_t count : {int64_t(0), int64_t(1), int64_t(7), int64_t(n + 1), int64_t(1000)}) {
        auto p = std::make_unique<Pending>();
        p->name = "bc." + std::string(dataTypeName(d)) + "." + std::to_string(root) + "." +
                  std::to_string(count);
        uint64_t seed = seedOf(d, root, static_cast<int>(count));
        p->input = HostTensor(d, {count});
        p->expected = HostTensor(d, {count});
        fillInput(p->input, ReduceOp::kSum, me, seed);  // non-roots hold other values
        fillInput(p->expected, ReduceOp::kSum, root, seed);
        OpOptions o;
        o.root = root;
        Status s = broadcastAsync(p->name, p->input.view(), o, &p->handle);
        INFO("submit " << p->name << ": " << describe(s));
        REQUIRE(s.ok());
        pending.push_back(std::move(p));
      }
    }
    for (auto& p : pending) {
      Status s = waitFor(p->handle);
      INFO("rank " << me << " of " << n << ": '" << p->name << "'");
      CHECK(describe(s) == "kOk");
      CHECK(compare(p->expected, p->input.data(), p->expected.numel(), p->name) == "");
    }
  }
}

TEST_CASE("broadcast through the C API, flat and shaped", "[broadcast][c_api]") {
  requireInit();
  const int root = size() - 1;
  HostTensor flat(DataType::kInt64, {5}), shaped(DataType::kFloat64, {2, 3, 2});
  HostTensor flat_expected(DataType::kInt64, {5}), shaped_expected(DataType::kFloat64, {2, 3, 2});
  fillInput(flat, ReduceOp::kMax, rank(), 5);
  fillInput(flat_expected, ReduceOp::kMax, root, 5);
  fillInput(shaped, ReduceOp::kMax, rank(), 6);
  fillInput(shaped_expected, ReduceOp::kMax, root, 6);
  tutti_handle_t h1 = 0, h2 = 0;
  REQUIRE(tutti_broadcast_async("cbc.flat", flat.data(), 5, TUTTI_INT64, root, &h1) == TUTTI_OK);
  tutti_tensor_t t;
  t.data = shaped.data();
  t.dtype = TUTTI_FLOAT64;
  t.ndim = 3;
  t.shape[0] = 2;
  t.shape[1] = 3;
  t.shape[2] = 2;
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.root = root;
  REQUIRE(tutti_broadcast_tensor_async("cbc.shaped", &t, &o, &h2) == TUTTI_OK);
  CHECK(tutti_wait(h1, kWaitSeconds) == TUTTI_OK);
  CHECK(tutti_wait(h2, kWaitSeconds) == TUTTI_OK);
  CHECK(compare(flat_expected, flat.data(), 5, "cbc.flat") == "");
  CHECK(compare(shaped_expected, shaped.data(), 12, "cbc.shaped") == "");
}

namespace {

// Rows each rank contributes to allgather, per pattern.
int64_t gatherRows(int pattern, int r) {
  switch (pattern) {
    case 0: return 2;                            // equal
    case 1: return r % 2 == 0 ? 0 : r + 1;       // rank 0 (and other evens) send nothing
    case 2: return r + 1;                        // all different
    default: return 0;                           // nobody sends anything
  }
}

}  // namespace

TEST_CASE("allgather with a first dimension that differs per rank", "[allgather]") {
  requireInit();
  const int me = rank(), n = size();
  for (DataType d : allDataTypes()) {
    std::vector<std::unique_ptr<Pending>> pending;
    for (int pattern = 0; pattern < 4; ++pattern) {
      auto p = std::make_unique<Pending>();
      p->name = "ag." + std::string(dataTypeName(d)) + "." + std::to_string(pattern);
      uint64_t seed = seedOf(d, pattern, 1);
      int64_t total = 0;
      for (int r = 0; r < n; ++r) total += gatherRows(pattern, r);
      p->input = HostTensor(d, {gatherRows(pattern, me), 3});
      p->expected = HostTensor(d, {total, 3});
      fillInput(p->input, ReduceOp::kSum, me, seed);
      int64_t at = 0;
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < gatherRows(pattern, r) * 3; ++i)
          p->expected.set(at++, inputValue(d, ReduceOp::kSum, r, seed, i));
      Status s = allgatherAsync(p->name, p->input.view(), OpOptions(), &p->handle);
      INFO("submit " << p->name << ": " << describe(s));
      REQUIRE(s.ok());
      pending.push_back(std::move(p));
    }
    for (auto& p : pending) finishResult(*p);
  }
}

TEST_CASE("allgather into memory from OpOptions::allocator", "[allgather]") {
  requireInit();
  const int me = rank(), n = size();
  HostTensor in(DataType::kInt16, {me + 1, 2});
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += r + 1;
  HostTensor expected(DataType::kInt16, {total, 2});
  fillInput(in, ReduceOp::kSum, me, 77);
  int64_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < (r + 1) * 2; ++i)
      expected.set(at++, inputValue(DataType::kInt16, ReduceOp::kSum, r, 77, i));
  std::vector<int16_t> storage;
  std::vector<int64_t> asked_shape;
  int calls = 0;
  OpOptions o;
  o.allocator = [&](const std::vector<int64_t>& shape) -> void* {
    ++calls;
    asked_shape = shape;
    int64_t count = 1;
    for (int64_t s : shape) count *= s;
    storage.assign(static_cast<size_t>(count + 1), 0);
    return storage.data();
  };
  Handle h = 0;
  REQUIRE(allgatherAsync("ag.alloc", in.view(), o, &h).ok());
  Result r;
  Status s = waitFor(h, &r);
  CHECK(describe(s) == "kOk");
  CHECK(calls == 1);
  CHECK(listText(asked_shape) == listText(std::vector<int64_t>{total, 2}));
  CHECK(r.data == static_cast<void*>(storage.data()));
  CHECK(compare(expected, storage.data(), total * 2, "ag.alloc") == "");
}

TEST_CASE("allgather through the C API", "[allgather][c_api]") {
  requireInit();
  const int me = rank(), n = size();
  HostTensor in(DataType::kFloat32, {me, 2});  // rank 0 sends no rows
  fillInput(in, ReduceOp::kSum, me, 31);
  int64_t total = n * (n - 1) / 2;
  HostTensor expected(DataType::kFloat32, {total, 2});
  int64_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < r * 2; ++i)
      expected.set(at++, inputValue(DataType::kFloat32, ReduceOp::kSum, r, 31, i));
  tutti_tensor_t t;
  t.data = in.data();
  t.dtype = TUTTI_FLOAT32;
  t.ndim = 2;
  t.shape[0] = me;
  t.shape[1] = 2;
  tutti_handle_t h = 0;
  REQUIRE(tutti_allgather_async("cag", &t, nullptr, &h) == TUTTI_OK);
  tutti_result_t res;
  res.struct_size = sizeof(res);
  tutti_status_t s = tutti_wait_result(h, kWaitSeconds, &res);
  INFO("tutti_wait_result: " << tutti_status_string(s) << " " << tutti_last_error());
  REQUIRE(s == TUTTI_OK);
  CHECK(res.ndim == 2);
  CHECK(res.shape[0] == total);
  CHECK(res.shape[1] == 2);
  CHECK(res.nbytes == total * 2 * 4);
  CHECK(compare(expected, res.data, total * 2, "cag") == "");
  CHECK(res.recv_splits == nullptr);  // alltoall only
  CHECK(res.last_joined_rank == -1);  // join only
  tutti_free(res.data);
  tutti_free(res.recv_splits);
}

namespace {

// Rows rank r sends to rank j, per pattern (2 = equal splits, passed as empty splits).
int64_t sendRows(int pattern, int r, int j) {
  switch (pattern) {
    case 0: return (r + 2 * j) % 3;        // uneven, some zero
    case 1: return r == 0 ? 0 : j + 1;     // rank 0 sends nothing
    default: return 2;                      // equal
  }
}

}  // namespace

TEST_CASE("alltoall with uneven, zero-size and equal splits", "[alltoall]") {
  requireInit();
  const int me = rank(), n = size();
  const int64_t kCols = 2;
  for (DataType d : allDataTypes()) {
    std::vector<std::unique_ptr<Pending>> pending;
    for (int pattern = 0; pattern < 3; ++pattern) {
      auto p = std::make_unique<Pending>();
      p->name = "a2a." + std::string(dataTypeName(d)) + "." + std::to_string(pattern);
      uint64_t seed = seedOf(d, pattern, 2);
      OpOptions o;
      int64_t my_rows = 0, recv_rows = 0;
      for (int j = 0; j < n; ++j) {
        my_rows += sendRows(pattern, me, j);
        if (pattern != 2) o.splits.push_back(sendRows(pattern, me, j));
      }
      for (int r = 0; r < n; ++r) {
        recv_rows += sendRows(pattern, r, me);
        p->expected_splits.push_back(sendRows(pattern, r, me));
      }
      p->input = HostTensor(d, {my_rows, kCols});
      p->expected = HostTensor(d, {recv_rows, kCols});
      fillInput(p->input, ReduceOp::kSum, me, seed);
      int64_t at = 0;
      for (int r = 0; r < n; ++r) {
        int64_t offset = 0;  // first row rank r sends to me
        for (int j = 0; j < me; ++j) offset += sendRows(pattern, r, j);
        for (int64_t i = 0; i < sendRows(pattern, r, me) * kCols; ++i)
          p->expected.set(at++, inputValue(d, ReduceOp::kSum, r, seed, offset * kCols + i));
      }
      Status s = alltoallAsync(p->name, p->input.view(), o, &p->handle);
      INFO("submit " << p->name << ": " << describe(s));
      REQUIRE(s.ok());
      pending.push_back(std::move(p));
    }
    for (auto& p : pending) finishResult(*p);
  }
}

TEST_CASE("alltoall through the C API returns recv_splits", "[alltoall][c_api]") {
  requireInit();
  const int me = rank(), n = size();
  std::vector<int64_t> splits;
  int64_t rows = 0, recv = 0;
  for (int j = 0; j < n; ++j) {
    splits.push_back(sendRows(0, me, j));
    rows += splits.back();
    recv += sendRows(0, j, me);
  }
  HostTensor in(DataType::kInt32, {rows});
  fillInput(in, ReduceOp::kSum, me, 404);
  tutti_tensor_t t;
  t.data = in.data();
  t.dtype = TUTTI_INT32;
  t.ndim = 1;
  t.shape[0] = rows;
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.splits = splits.data();
  o.nsplits = n;
  tutti_handle_t h = 0;
  REQUIRE(tutti_alltoall_async("ca2a", &t, &o, &h) == TUTTI_OK);
  tutti_result_t res;
  res.struct_size = sizeof(res);
  REQUIRE(tutti_wait_result(h, kWaitSeconds, &res) == TUTTI_OK);
  CHECK(res.ndim == 1);
  CHECK(res.shape[0] == recv);
  REQUIRE(res.nsplits == n);
  REQUIRE(res.recv_splits != nullptr);
  for (int r = 0; r < n; ++r) CHECK(res.recv_splits[r] == sendRows(0, r, me));
  tutti_free(res.data);
  tutti_free(res.recv_splits);
}

TEST_CASE("reducescatter: every dtype and reduce op, uneven rows", "[reducescatter]") {
  requireInit();
  const int me = rank(), n = size();
  const int64_t kCols = 3;
  std::set<int64_t> row_counts = {0, 1, 7, int64_t(n) + 1, 2ll * n + 1};
  if (n > 1) row_counts.insert(n - 1);  // fewer rows than ranks
  for (DataType d : allDataTypes()) {
    std::vector<std::unique_ptr<Pending>> pending;
    for (ReduceOp op : allReduceOps()) {
      if (d == DataType::kBool && op == ReduceOp::kAverage) continue;
      for (int64_t rows : row_counts) {
        auto p = std::make_unique<Pending>();
        p->name = "rs." + std::string(dataTypeName(d)) + "." + opName(op) + "." +
                  std::to_string(rows);
        uint64_t seed = seedOf(d, static_cast<int>(op), static_cast<int>(rows));
        const int64_t base = rows / n, extra = rows % n;
        const int64_t my_rows = base + (me < extra ? 1 : 0);
        const int64_t first = me * base + std::min<int64_t>(me, extra);
        p->input = HostTensor(d, {rows, kCols});
        p->expected = HostTensor(d, {my_rows, kCols});
        fillInput(p->input, op, me, seed);
        std::vector<double> all(static_cast<size_t>(n));
        for (int64_t i = 0; i < my_rows * kCols; ++i) {
          for (int r = 0; r < n; ++r)
            all[static_cast<size_t>(r)] = inputValue(d, op, r, seed, first * kCols + i);
          p->expected.set(i, referenceReduce(d, op, all, 1.0, 1.0, n));
        }
        OpOptions o;
        o.op = op;
        Status s = reducescatterAsync(p->name, p->input.view(), o, &p->handle);
        INFO("submit " << p->name << ": " << describe(s));
        REQUIRE(s.ok());
        pending.push_back(std::move(p));
      }
    }
    for (auto& p : pending) finishResult(*p);
  }
}

TEST_CASE("barrier completes only after every rank entered", "[barrier]") {
  requireInit();
  const int me = rank(), n = size();
  for (int round = 0; round < 2; ++round) {
    // Ranks enter at staggered times; the C++ barrier in round 0, the C one in round 1.
    sleepMillis(((me + round) % n) * 150);
    HostTensor times(DataType::kInt64, {2});
    times.set(0, static_cast<double>(wallMicros()));
    if (round == 0) {
      Handle h = 0;
      REQUIRE(barrierAsync(TUTTI_GLOBAL_PROCESS_SET, &h).ok());
      CHECK(describe(waitFor(h)) == "kOk");
    } else {
      CHECK(tutti_barrier(TUTTI_GLOBAL_PROCESS_SET, kWaitSeconds) == TUTTI_OK);
    }
    times.set(1, static_cast<double>(wallMicros()));
    Handle h = 0;
    REQUIRE(allgatherAsync("barrier.times", times.view(), OpOptions(), &h).ok());
    Result r;
    REQUIRE(waitFor(h, &r).ok());
    REQUIRE(r.shape == std::vector<int64_t>{2ll * n});
    const auto* t = static_cast<const int64_t*>(r.data);
    int64_t last_entry = 0;
    for (int k = 0; k < n; ++k) last_entry = std::max(last_entry, t[2 * k]);
    for (int k = 0; k < n; ++k) {
      INFO("round " << round << ": rank " << k << " left the barrier " << (last_entry - t[2 * k + 1])
                    << " us before the last rank entered it");
      CHECK(t[2 * k + 1] >= last_entry);
    }
    std::free(r.data);
  }
}
