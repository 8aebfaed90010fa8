// Input hardening across real processes: sizes that overflow, through the
// C and C++ APIs, alone and next to valid ops that would fuse with them; sizes that overflow
// only once other ranks' rows are added; struct_size, nsplits, the dimension limit and huge
// names. Every refusal is TUTTI_ERR_INVALID_ARGUMENT naming the tensor, and the job goes on.
#include "test/integration/test_util.h"

#include <tutti/tutti.h>

#include "test/catch.h"

#include <climits>
#include <cstdlib>
#include <limits>

using namespace tutti;
using namespace tutti::itest;

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The C call's status must be kInvalidArgument with a last error naming `name`.
void expectRefused(tutti_status_t s, const std::string& name, const std::string& also = "") {
  const std::string error = tutti_last_error();
  INFO(name << ": " << tutti_status_string(s) << " / '" << error << "'");
  CHECK(s == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(error.find("'" + name + "'") != std::string::npos);
  if (!also.empty()) CHECK(error.find(also) != std::string::npos);
}

tutti_tensor_t tensor(void* data, tutti_dtype_t dtype, std::vector<int64_t> shape) {
  tutti_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

// A correct allreduce of 8 int32 after the refusals.
void allreduceStillWorks(const char* name) {
  int32_t x[8];
  for (int i = 0; i < 8; ++i) x[i] = rank() + i;
  tutti_handle_t h = 0;
  REQUIRE(tutti_allreduce_async(name, x, x, 8, TUTTI_INT32, TUTTI_SUM, 1, 1, &h) == TUTTI_OK);
  REQUIRE(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  const int n = size();
  for (int i = 0; i < 8; ++i) CHECK(x[i] == n * (n - 1) / 2 + n * i);
}

}  // namespace

TEST_CASE("counts whose bytes overflow are refused at submit", "[hardening]") {
  requireInit();
  float buf[4] = {0, 0, 0, 0};
  tutti_handle_t h = 0;
  expectRefused(tutti_allreduce_async("ov.2p61", buf, buf, int64_t(1) << 61, TUTTI_FLOAT32,
                                      TUTTI_SUM, 1, 1, &h),
                "ov.2p61", "too large");
  expectRefused(tutti_allreduce_async("ov.max_u8", buf, buf, kInt64Max, TUTTI_UINT8, TUTTI_SUM,
                                      1, 1, &h),
                "ov.max_u8");
  // 2^62 float32 is 2^64 bytes: once wrapped to 0 and "completed" doing nothing.
  expectRefused(tutti_allreduce_async("ov.2p62", buf, buf, int64_t(1) << 62, TUTTI_FLOAT32,
                                      TUTTI_SUM, 1, 1, &h),
                "ov.2p62");
  expectRefused(tutti_broadcast_async("ov.bcast", buf, int64_t(1) << 61, TUTTI_FLOAT64, 0, &h),
                "ov.bcast");
  tutti_tensor_t t = tensor(buf, TUTTI_UINT8, {kInt64Max / 2, 4});
  expectRefused(tutti_allreduce_tensor_async("ov.shape", &t, &t, nullptr, &h), "ov.shape");
  expectRefused(tutti_allgather_async("ov.ag", &t, nullptr, &h), "ov.ag");
  expectRefused(tutti_reducescatter_async("ov.rs", &t, nullptr, &h), "ov.rs");
  expectRefused(tutti_broadcast_tensor_async("ov.bt", &t, nullptr, &h), "ov.bt");
  t.shape[0] = kInt64Max / 2 * size();  // splits evenly: only the size is wrong
  expectRefused(tutti_alltoall_async("ov.a2a", &t, nullptr, &h), "ov.a2a");
  allreduceStillWorks("ov.after");
}

TEST_CASE("an overflowing op next to ops it would fuse with", "[hardening]") {
  requireInit();
  float a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = b[i] = 1.0f;
  tutti_handle_t ha = 0, hb = 0, hx = 0;
  REQUIRE(tutti_allreduce_async("fuse.a", a, a, 16, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &ha) == TUTTI_OK);
  tutti_tensor_t huge = tensor(a, TUTTI_FLOAT32, {kInt64Max / 2, 4});
  expectRefused(tutti_allreduce_tensor_async("fuse.huge", &huge, &huge, nullptr, &hx), "fuse.huge");
  expectRefused(tutti_allreduce_async("fuse.wrap", b, b, int64_t(1) << 62, TUTTI_FLOAT32,
                                      TUTTI_SUM, 1, 1, &hx),
                "fuse.wrap");
  REQUIRE(tutti_allreduce_async("fuse.b", b, b, 16, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &hb) == TUTTI_OK);
  CHECK(tutti_wait(ha, kWaitSeconds) == TUTTI_OK);
  CHECK(tutti_wait(hb, kWaitSeconds) == TUTTI_OK);
  for (int i = 0; i < 16; ++i) {
    CHECK(a[i] == static_cast<float>(size()));
    CHECK(b[i] == static_cast<float>(size()));
  }
}

TEST_CASE("rows that overflow only once every rank's are added: an error on every handle", "[hardening]") {
  requireInit();
  if (size() < 2) return;  // one rank's rows alone are within the limit: nothing to refuse
  // 2^54 rows of float32 are 2^56 bytes, the most one tensor may have: valid here, too
  // large once a second rank's rows join. The buffer is never read: the op is refused first.
  float dummy[4] = {0, 0, 0, 0};
  const int64_t rows = TUTTI_MAX_TENSOR_BYTES / 4;
  tutti_tensor_t t = tensor(dummy, TUTTI_FLOAT32, {rows});
  tutti_handle_t h = 0;
  REQUIRE(tutti_allgather_async("sum.ag", &t, nullptr, &h) == TUTTI_OK);
  tutti_result_t r{};
  r.struct_size = sizeof r;
  tutti_status_t s = tutti_wait_result(h, kWaitSeconds, &r);
  expectRefused(s, "sum.ag", "too large");
  // alltoall: every rank sends all its rows to rank 0.
  std::vector<int64_t> splits(static_cast<size_t>(size()), 0);
  splits[0] = rows;
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.splits = splits.data();
  o.nsplits = size();
  REQUIRE(tutti_alltoall_async("sum.a2a", &t, &o, &h) == TUTTI_OK);
  r = tutti_result_t{};
  r.struct_size = sizeof r;
  expectRefused(tutti_wait_result(h, kWaitSeconds, &r), "sum.a2a", "on rank 0");
  allreduceStillWorks("sum.after");
}

TEST_CASE("struct_size, nsplits, the dimension limit and huge names", "[hardening]") {
  requireInit();
  float buf[8] = {};
  tutti_handle_t h = 0;
  tutti_tensor_t t = tensor(buf, TUTTI_FLOAT32, {static_cast<int64_t>(size())});
  tutti_op_options_t o;
  for (size_t bad : {size_t(0), size_t(1) << 30, sizeof(tutti_op_options_t) - 1}) {
    tutti_op_options_init(&o);
    o.struct_size = bad;
    expectRefused(tutti_allreduce_tensor_async("ss.opts", &t, &t, &o, &h), "ss.opts", "struct_size");
  }
  tutti_op_options_init(&o);
  int64_t splits[2] = {1, 1};
  o.splits = splits;
  o.nsplits = -1;
  expectRefused(tutti_alltoall_async("ns.neg", &t, &o, &h), "ns.neg", "nsplits is -1");
  o.nsplits = INT_MAX;  // refused before the 2 splits given are read past their end
  expectRefused(tutti_alltoall_async("ns.max", &t, &o, &h), "ns.max", "nsplits is");
  o.splits = nullptr;
  o.nsplits = 3;
  expectRefused(tutti_alltoall_async("ns.null", &t, &o, &h), "ns.null", "splits is NULL");
  // The C++ API has no ndim field: the limit is checked at submit.
  HostTensor nine(DataType::kFloat32, std::vector<int64_t>(TUTTI_MAX_DIMS + 1, 1));
  Handle hh = 0;
  Status st = allreduceAsync("dims.cpp", nine.view(), nine.view(), OpOptions(), &hh);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message() == "allreduce 'dims.cpp': shape has 9 dimensions, expected at most 8");
  CHECK(allgatherAsync("dims.cpp.ag", nine.view(), OpOptions(), &hh).code() == StatusCode::kInvalidArgument);
  // 8 dimensions through allgather: tutti_wait_result reports all 8, no more.
  tutti_tensor_t eight = tensor(buf, TUTTI_FLOAT32, {1, 1, 2, 1, 1, 1, 2, 1});
  REQUIRE(tutti_allgather_async("dims.8", &eight, nullptr, &h) == TUTTI_OK);
  tutti_result_t r{};
  r.struct_size = sizeof r;
  REQUIRE(tutti_wait_result(h, kWaitSeconds, &r) == TUTTI_OK);
  CHECK(r.ndim == 8);
  CHECK(r.shape[0] == size());
  CHECK(r.shape[6] == 2);
  CHECK(r.nbytes == 4 * 4 * size());
  tutti_free(r.data);
  for (size_t bad : {size_t(0), size_t(1) << 30}) {
    r.struct_size = bad;
    CHECK(tutti_wait_result(h, 0, &r) == TUTTI_ERR_INVALID_ARGUMENT);
    CHECK(std::string(tutti_last_error()).find("struct_size") != std::string::npos);
  }
  // A 100 KB name: refused, and the message shows a prefix and the length, not 100 KB.
  const std::string name(100 * 1024, 'n');
  tutti_status_t s = tutti_allreduce_async(name.c_str(), buf, buf, 1, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h);
  CHECK(s == TUTTI_ERR_INVALID_ARGUMENT);
  const std::string error = tutti_last_error();
  CHECK(error.size() < 200);
  CHECK(error.find("(102400 bytes)") != std::string::npos);
  allreduceStillWorks("ss.after");
}
