// Errors across real processes: every kind of cross-rank mismatch (same code on every rank, a
// message naming the tensor and the field, and the next op still works), duplicate names,
// bad arguments through both APIs, and poll / wait / callback semantics.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

using namespace tutti;
using namespace tutti::itest;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool mentions(const std::string& message, const std::string& word) {
  return lower(message).find(lower(word)) != std::string::npos;
}

// After an error, the runtime still runs a correct allreduce.
void nextOpWorks(const std::string& after) {
  HostTensor t(DataType::kInt32, {5}), x(DataType::kInt32, {5});
  fillInput(t, ReduceOp::kSum, rank(), 42);
  for (int64_t i = 0; i < 5; ++i) {
    std::vector<double> v;
    for (int r = 0; r < size(); ++r) v.push_back(inputValue(DataType::kInt32, ReduceOp::kSum, r, 42, i));
    x.set(i, referenceReduce(DataType::kInt32, ReduceOp::kSum, v, 1, 1, size()));
  }
  Handle h = 0;
  REQUIRE(allreduceAsync("after." + after, t.view(), t.view(), OpOptions(), &h).ok());
  INFO("rank " << rank() << ": the allreduce after '" << after << "'");
  CHECK(describe(waitFor(h)) == "kOk");
  CHECK(compare(x, t.data(), 5, "after." + after) == "");
}

struct MismatchCase {
  const char* name;     // tensor name, also the case's label
  const char* field;    // a word the message must contain
  const char* field2;   // and another one (the two values, where they have names), or ""
};

// Submits the op of `c` on this rank, rank 1 deviating in one field. Returns the status.
Status submitMismatch(const MismatchCase& c, HostTensor& buf, int deviant) {
  const bool odd = rank() == deviant;
  const std::string kind = c.name;
  OpOptions o;
  Handle h = 0;
  Status s;
  TensorView v = buf.view();
  if (kind == "mm.dtype") {
    if (odd) v.dtype = DataType::kInt32;  // same byte size as float32
    s = allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.shape") {
    if (odd) v.shape = {4, 9};
    else v.shape = {4, 8};
    s = allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.reduceop") {
    o.op = odd ? ReduceOp::kMax : ReduceOp::kSum;
    s = allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.prescale") {
    o.prescale = odd ? 2.0 : 1.0;
    s = allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.postscale") {
    o.postscale = odd ? 0.5 : 1.0;
    s = allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.root") {
    o.root = odd ? 1 : 0;
    s = broadcastAsync(c.name, v, o, &h);
  } else if (kind == "mm.optype") {
    s = odd ? broadcastAsync(c.name, v, o, &h) : allreduceAsync(c.name, v, v, o, &h);
  } else if (kind == "mm.agdims") {  // allgather: dims after the first must agree
    v.shape = {2, odd ? 18 : 16};
    s = allgatherAsync(c.name, v, o, &h);
  } else if (kind == "mm.agndim") {  // allgather: a different number of dims
    v.shape = odd ? std::vector<int64_t>{2, 16, 1} : std::vector<int64_t>{2, 16};
    s = allgatherAsync(c.name, v, o, &h);
  } else if (kind == "mm.a2adims") {  // alltoall: dims after the first must agree
    v.shape = {size(), odd ? 5 : 4};
    s = alltoallAsync(c.name, v, o, &h);
  } else if (kind == "mm.rsshape") {
    v.shape = {odd ? 9 : 8, 4};
    s = reducescatterAsync(c.name, v, o, &h);
  }
  if (!s.ok()) return Status(s.code(), "submission failed: " + s.message());
  Result r;
  s = waitFor(h, &r);
  std::free(r.data);
  return s;
}

}  // namespace

TEST_CASE("every mismatch kind fails on every rank, and the next op works", "[errors][mismatch]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 2) {
    SUCCEED("mismatches need two ranks");
    return;
  }
  const MismatchCase cases[] = {
      {"mm.dtype", "float32", "int32"}, {"mm.shape", "shape", "[4,9]"},
      {"mm.reduceop", "sum", "max"},    {"mm.prescale", "prescale", ""},
      {"mm.postscale", "postscale", ""}, {"mm.root", "root", ""},
      {"mm.optype", "allreduce", "broadcast"}, {"mm.agdims", "shape", ""},
      {"mm.rsshape", "shape", ""}, {"mm.agndim", "shape", ""}, {"mm.a2adims", "shape", ""}};
  for (const auto& c : cases) {
    for (int deviant : {1, n - 1}) {
      HostTensor buf(DataType::kFloat32, {64});  // room for the largest deviant shape
      buf.fill(1.0);
      Status s = submitMismatch(c, buf, deviant);
      INFO("rank " << me << ", case " << c.name << " (rank " << deviant << " deviates): "
                   << describe(s));
      CHECK(s.code() == StatusCode::kMismatch);
      CHECK(mentions(s.message(), c.name));
      CHECK(mentions(s.message(), c.field));
      if (*c.field2) CHECK(mentions(s.message(), c.field2));
      CHECK(mentions(s.message(), "rank " + std::to_string(deviant)));
      nextOpWorks(c.name);
    }
  }
}

TEST_CASE("a name already in flight is kDuplicateName; reuse after completion works", "[errors]") {
  requireInit();
  const int me = rank();
  HostTensor a(DataType::kFloat32, {3}), b(DataType::kFloat32, {3});
  a.fill(1.0);
  b.fill(2.0);
  // Every rank but 0 holds back, so rank 0's first "dup" cannot complete before its second.
  if (me != 0) sleepMillis(300);
  Handle h1 = 0, h2 = 0;
  REQUIRE(allreduceAsync("dup", a.view(), a.view(), OpOptions(), &h1).ok());
  if (me == 0 && size() > 1) {
    Status s = allreduceAsync("dup", b.view(), b.view(), OpOptions(), &h2);
    INFO("second 'dup' while the first is in flight: " << describe(s));
    CHECK(s.code() == StatusCode::kDuplicateName);
    CHECK(mentions(s.message(), "dup"));
    tutti_handle_t ch = 0;
    CHECK(tutti_allreduce_async("dup", b.data(), b.data(), 3, TUTTI_FLOAT32, TUTTI_SUM, 1, 1,
                                &ch) == TUTTI_ERR_DUPLICATE_NAME);
    CHECK(mentions(tutti_last_error(), "dup"));
  }
  CHECK(describe(waitFor(h1)) == "kOk");
  HostTensor x(DataType::kFloat32, {3});
  x.fill(size());
  CHECK(compare(x, a.data(), 3, "dup") == "");
  // The name is free again.
  REQUIRE(allreduceAsync("dup", b.view(), b.view(), OpOptions(), &h2).ok());
  CHECK(describe(waitFor(h2)) == "kOk");
  x.fill(2.0 * size());
  CHECK(compare(x, b.data(), 3, "dup again") == "");
}

TEST_CASE("bad arguments are kInvalidArgument with a last-error text", "[errors][c_api]") {
  requireInit();
  float buf[4] = {1, 2, 3, 4};
  tutti_handle_t h = 0;
  auto expectInvalid = [](tutti_status_t s, const char* what) {
    INFO(what << ": " << tutti_status_string(s) << " / tutti_last_error() = '" << tutti_last_error()
              << "'");
    CHECK(s == TUTTI_ERR_INVALID_ARGUMENT);
    CHECK(std::string(tutti_last_error()).size() > 0);
  };
  expectInvalid(tutti_allreduce_async("bad.in", nullptr, buf, 4, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h),
                "null input");
  expectInvalid(tutti_allreduce_async("bad.out", buf, nullptr, 4, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h),
                "null output");
  expectInvalid(tutti_allreduce_async("bad.h", buf, buf, 4, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, nullptr),
                "null handle");
  expectInvalid(tutti_allreduce_async("bad.count", buf, buf, -1, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h),
                "negative count");
  expectInvalid(tutti_allreduce_async("bad.dtype", buf, buf, 4, static_cast<tutti_dtype_t>(42),
                                      TUTTI_SUM, 1, 1, &h),
                "invalid dtype");
  expectInvalid(tutti_allreduce_async("bad.op", buf, buf, 4, TUTTI_FLOAT32,
                                      static_cast<tutti_reduce_op_t>(9), 1, 1, &h),
                "invalid reduce op");
  expectInvalid(tutti_broadcast_async("bad.root", buf, 4, TUTTI_FLOAT32, size(), &h),
                "root == size");
  expectInvalid(tutti_broadcast_async("bad.root2", buf, 4, TUTTI_FLOAT32, -1, &h), "root -1");
  expectInvalid(tutti_allgather_async("bad.ag", nullptr, nullptr, &h), "null tensor");
  tutti_tensor_t t;
  t.data = buf;
  t.dtype = TUTTI_FLOAT32;
  t.ndim = TUTTI_MAX_DIMS + 1;
  t.shape[0] = 4;
  expectInvalid(tutti_allgather_async("bad.ndim", &t, nullptr, &h), "ndim > TUTTI_MAX_DIMS");
  t.ndim = 1;
  t.shape[0] = -4;
  expectInvalid(tutti_allgather_async("bad.dim", &t, nullptr, &h), "negative dimension");
  t.shape[0] = 4;
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  int64_t splits[5] = {5, 0, 0, 0, 0};  // sum 5 != 4 rows
  o.splits = splits;
  o.nsplits = size();
  expectInvalid(tutti_alltoall_async("bad.splits", &t, &o, &h), "splits sum != rows");
  splits[0] = 4;
  o.nsplits = size() + 1;
  expectInvalid(tutti_alltoall_async("bad.nsplits", &t, &o, &h), "nsplits != set size");
  if (size() > 1) {
    splits[0] = 5;
    splits[1] = -1;
    o.nsplits = size();
    expectInvalid(tutti_alltoall_async("bad.negsplit", &t, &o, &h), "negative split");
    tutti_op_options_init(&o);
    t.shape[0] = size() + 1;  // does not divide evenly
    expectInvalid(tutti_alltoall_async("bad.equal", &t, &o, &h), "equal splits, rows % size");
  }
  tutti_op_options_init(&o);
  o.process_set = 12345;
  t.shape[0] = 4;
  expectInvalid(tutti_allreduce_tensor_async("bad.set", &t, &t, &o, &h), "unknown process set");
  // average on bool
  bool flags[2] = {true, false};
  tutti_status_t s = tutti_allreduce_async("bad.boolavg", flags, flags, 2, TUTTI_BOOL,
                                           TUTTI_AVERAGE, 1, 1, &h);
  if (s == TUTTI_OK) s = tutti_wait(h, kWaitSeconds);
  INFO("average on bool: " << tutti_status_string(s) << " " << tutti_last_error());
  CHECK(s == TUTTI_ERR_INVALID_ARGUMENT);
  // Input and output of different shapes (C++ API).
  HostTensor in(DataType::kFloat32, {4}), out(DataType::kFloat32, {5});
  Handle hh = 0;
  Status st = allreduceAsync("bad.outshape", in.view(), out.view(), OpOptions(), &hh);
  if (st.ok()) st = waitFor(hh);
  INFO("output shape differs: " << describe(st));
  CHECK(st.code() == StatusCode::kInvalidArgument);
  HostTensor out_i(DataType::kInt32, {4});
  st = allreduceAsync("bad.outdtype", in.view(), out_i.view(), OpOptions(), &hh);
  if (st.ok()) st = waitFor(hh);
  INFO("output dtype differs: " << describe(st));
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(tutti_wait(0, 1.0) == TUTTI_ERR_INVALID_ARGUMENT);  // 0 is never a handle
  int done = 0;
  CHECK(tutti_poll(987654321, &done) == TUTTI_ERR_INVALID_ARGUMENT);
  nextOpWorks("bad arguments");
}

TEST_CASE("poll, wait with a tiny timeout, and callbacks", "[errors][handles]") {
  requireInit();
  const int me = rank(), n = size();
  HostTensor t(DataType::kFloat64, {10});
  t.fill(me + 1.0);
  std::atomic<int> calls{0};
  std::atomic<int> status_code{-1};
  std::atomic<Handle> called_with{0};
  OpOptions o;
  o.callback = [&](Handle h, const Status& s) {
    status_code = static_cast<int>(s.code());
    called_with = h;
    ++calls;
  };
  // Every rank but 0 holds back, so rank 0's op cannot complete before 300 ms have passed.
  if (me != 0) sleepMillis(300);
  Handle h = 0;
  REQUIRE(allreduceAsync("handles", t.view(), t.view(), o, &h).ok());
  CHECK(h != 0);
  if (me == 0 && n > 1) {
    bool done = true;
    CHECK(poll(h, &done).ok());
    CHECK_FALSE(done);
    Status s = wait(h, 0.01);
    INFO("wait(0.01 s) on an op other ranks have not submitted: " << describe(s));
    CHECK(s.code() == StatusCode::kInProgress);
    CHECK(tutti_wait(h, 0.0) == TUTTI_ERR_IN_PROGRESS);
  }
  // The handle still works; poll until done, then wait releases it.
  bool done = false;
  for (int i = 0; i < 6000 && !done; ++i) {
    REQUIRE(poll(h, &done).ok());
    if (!done) sleepMillis(10);
  }
  CHECK(done);
  CHECK(describe(waitFor(h)) == "kOk");
  HostTensor x(DataType::kFloat64, {10});
  x.fill(n * (n + 1) / 2.0);
  CHECK(compare(x, t.data(), 10, "handles") == "");
  for (int i = 0; i < 500 && calls.load() == 0; ++i) sleepMillis(10);
  sleepMillis(50);
  CHECK(calls.load() == 1);
  CHECK(status_code.load() == 0);
  CHECK(called_with.load() == h);
  // A released handle is unknown.
  Status again = wait(h, 0.1);
  INFO("wait on a released handle: " << describe(again));
  CHECK(again.code() == StatusCode::kInvalidArgument);
}

namespace {
struct CallbackLog {
  std::atomic<int> calls{0};
  std::atomic<int> status{-1};
};
void cCallback(tutti_handle_t, tutti_status_t status, const char*, void* user_data) {
  auto* log = static_cast<CallbackLog*>(user_data);
  log->status = status;
  ++log->calls;
}
}  // namespace

TEST_CASE("C callbacks fire once with user_data, also for errors", "[errors][c_api]") {
  requireInit();
  float v[3] = {1, 1, 1};
  CallbackLog ok_log, err_log;
  tutti_tensor_t t;
  t.data = v;
  t.dtype = TUTTI_FLOAT32;
  t.ndim = 1;
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.callback = cCallback;
  o.user_data = &ok_log;
  tutti_handle_t h1 = 0, h2 = 0;
  t.shape[0] = 3;
  REQUIRE(tutti_allreduce_tensor_async("ccb.ok", &t, &t, &o, &h1) == TUTTI_OK);
  CHECK(tutti_wait(h1, kWaitSeconds) == TUTTI_OK);
  if (size() > 1) {
    t.shape[0] = rank() == 1 ? 2 : 3;  // rank 1 deviates: a mismatch
    o.user_data = &err_log;
    REQUIRE(tutti_allreduce_tensor_async("ccb.err", &t, &t, &o, &h2) == TUTTI_OK);
    CHECK(tutti_wait(h2, kWaitSeconds) == TUTTI_ERR_MISMATCH);
  }
  for (int i = 0; i < 500 && (ok_log.calls == 0 || (size() > 1 && err_log.calls == 0)); ++i)
    sleepMillis(10);
  sleepMillis(50);
  CHECK(ok_log.calls.load() == 1);
  CHECK(ok_log.status.load() == TUTTI_OK);
  if (size() > 1) {
    CHECK(err_log.calls.load() == 1);
    CHECK(err_log.status.load() == TUTTI_ERR_MISMATCH);
  }
}
