// Input hardening without threads: checked arithmetic, the size limit,
// every local check at submit, counts from other ranks at the coordinator, fusion of sizes
// that do not fit, and response lists whose counts the executor could not use.
#include "core/coordinator.h"
#include "core/fusion.h"
#include "core/validation.h"

#include "test/catch.h"

#include <limits>

using namespace tutti;

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TensorEntry entry(OpType op, std::vector<int64_t> shape, DataType dtype = DataType::kFloat32) {
  static char buf[64];
  TensorEntry e;
  e.request.op = op;
  e.request.name = "t";
  e.request.shape = std::move(shape);
  e.request.dtype = dtype;
  e.input = buf;
  e.output = buf;
  return e;
}

// The message of validateEntry's refusal, or "accepted".
std::string refusal(TensorEntry e, int set_size = 2) {
  try {
    validateEntry(e, set_size);
  } catch (const Error& error) {
    CHECK(error.code() == StatusCode::kInvalidArgument);
    return error.what();
  }
  return "accepted";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("checked arithmetic and the tensor size limit") {
  int64_t out = 7;
  CHECK(checkedMul(int64_t(1) << 31, int64_t(1) << 31, &out));
  CHECK(out == int64_t(1) << 62);
  CHECK_FALSE(checkedMul(int64_t(1) << 62, 4, &out));
  CHECK_FALSE(checkedMul(kInt64Max / 2, 4, &out));
  CHECK(out == int64_t(1) << 62);  // untouched on overflow
  CHECK_FALSE(checkedAdd(kInt64Max, 1, &out));
  CHECK(checkedAdd(-5, 3, &out));
  CHECK(out == -2);
  int64_t bytes = -1;
  CHECK(tensorBytes({}, DataType::kFloat64, &bytes));
  CHECK(bytes == 8);
  CHECK(tensorBytes({3, 0, 5}, DataType::kFloat32, &bytes));
  CHECK(bytes == 0);
  CHECK(tensorBytes({kMaxTensorBytes / 4}, DataType::kFloat32, &bytes));
  CHECK(bytes == kMaxTensorBytes);
  CHECK_FALSE(tensorBytes({kMaxTensorBytes / 4 + 1}, DataType::kFloat32, &bytes));
  CHECK_FALSE(tensorBytes({int64_t(1) << 61}, DataType::kFloat32, &bytes));  // 2^63 bytes
  CHECK_FALSE(tensorBytes({int64_t(1) << 62}, DataType::kFloat32, &bytes));  // wraps to 0
  CHECK_FALSE(tensorBytes({kInt64Max}, DataType::kUInt8, &bytes));
  CHECK_FALSE(tensorBytes({kInt64Max / 2, 4}, DataType::kUInt8, &bytes));
  CHECK_FALSE(tensorBytes({0, int64_t(1) << 62, int64_t(1) << 62}, DataType::kUInt8, &bytes));
  CHECK_FALSE(tensorBytes({4, -1}, DataType::kUInt8, &bytes));
}

TEST_CASE("names in messages are shortened") {
  CHECK(quotedName("grad.w") == "'grad.w'");
  const std::string longer = quotedName(std::string(100 * 1024, 'n'));
  CHECK(longer.size() < 100);
  CHECK(contains(longer, "(102400 bytes)"));
}

TEST_CASE("every size that overflows is refused at submit, naming the tensor") {
  for (auto& shape : std::vector<std::vector<int64_t>>{
           {int64_t(1) << 61}, {int64_t(1) << 62}, {kInt64Max / 2, 4}, {2, 0, kInt64Max, 3}}) {
    for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather,
                      OpType::kReducescatter}) {
      INFO(opTypeName(op) << " " << shapeString(shape));
      std::string message = refusal(entry(op, shape));
      CHECK(contains(message, std::string(opTypeName(op)) + " 't': shape "));
      CHECK(contains(message, "too large"));
    }
  }
  CHECK(contains(refusal(entry(OpType::kAllreduce, {kInt64Max}, DataType::kUInt8)), "too large"));
  // 2^56 bytes is the limit itself: accepted (the buffers are the caller's business).
  CHECK(refusal(entry(OpType::kAllreduce, {kMaxTensorBytes}, DataType::kUInt8)) == "accepted");
}

TEST_CASE("the dimension limit holds for every path, alltoall splits are checked whole") {
  std::string message = refusal(entry(OpType::kAllreduce, std::vector<int64_t>(TUTTI_MAX_DIMS + 1, 1)));
  CHECK(message == "allreduce 't': shape has 9 dimensions, expected at most 8");
  CHECK(refusal(entry(OpType::kAllgather, std::vector<int64_t>(TUTTI_MAX_DIMS, 1))) == "accepted");
  TensorEntry a = entry(OpType::kAlltoall, {4});
  a.request.splits = {kInt64Max, kInt64Max};
  CHECK(refusal(a) == "alltoall 't': splits sum to more than 4 but the first dimension is 4");
  a.request.splits = {4, kInt64Max};  // the sum overflows right after matching
  CHECK(refusal(a) == "alltoall 't': splits sum to more than 4 but the first dimension is 4");
  a.request.splits = {5, -1};
  CHECK(refusal(a) == "alltoall 't': splits contain a negative count (-1)");
  a.request.splits = {};
  CHECK(refusal(a, 3) == "alltoall 't': first dimension 4 does not split evenly over 3 ranks; pass splits");
  a.request.splits = {};
  a.request.shape = {kInt64Max / 2 * 2, 4};  // splits evenly, but too large
  CHECK(contains(refusal(a), "too large"));
}

TEST_CASE("a huge name is refused, and echoed shortened") {
  TensorEntry e = entry(OpType::kAllreduce, {4});
  e.request.name = std::string(100 * 1024, 'x');
  std::string message = refusal(e);
  CHECK(message.size() < 200);
  CHECK(contains(message, "(102400 bytes)"));
  CHECK(contains(message, "name is 102400 bytes, expected at most 4096"));
}

TEST_CASE("a group size from another rank is checked before the coordinator holds a group") {
  TensorEntry e = entry(OpType::kAllreduce, {4});
  e.request.group = "t/2";
  e.request.group_size = 2;
  CHECK(refusal(e) == "accepted");
  for (int32_t bad : {0, 1, -5, (1 << 24) + 1}) {
    e.request.group_size = bad;
    CHECK(refusal(e) == "allreduce 't': group 't/2' of " + std::to_string(bad) +
                            " tensors, expected 2 to 16777216");
  }
  // At the coordinator: an error on every rank's handle, not a group waiting for ever.
  Request q = e.request;
  Coordinator c(2);
  c.addRequests(0, {q}, Clock::now());
  c.addRequests(1, {q}, Clock::now());
  auto ready = c.takeReady();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].type == ResponseType::kError);
  CHECK(contains(ready[0].error_message, "(request of rank 0)"));
}

TEST_CASE("the coordinator checks counts from other ranks") {
  auto request = [](std::vector<int64_t> shape) {
    Request q;
    q.name = "g";
    q.op = OpType::kAllgather;
    q.dtype = DataType::kFloat32;
    q.shape = std::move(shape);
    return q;
  };
  {  // every rank's rows fit, their sum does not
    Coordinator c(3);
    for (int r = 0; r < 3; ++r) c.addRequests(r, {request({kMaxTensorBytes / 8, 2})}, Clock::now());
    auto ready = c.takeReady();
    REQUIRE(ready.size() == 1);
    CHECK(ready[0].type == ResponseType::kError);
    CHECK(ready[0].error_code == StatusCode::kInvalidArgument);
    CHECK(contains(ready[0].error_message, "allgather 'g': the output would be too large"));
  }
  {  // a rank whose request never passed validation (a sender that skipped its checks)
    Coordinator c(2);
    c.addRequests(0, {request({4, 2})}, Clock::now());
    c.addRequests(1, {request({kInt64Max / 2, 4})}, Clock::now());
    auto ready = c.takeReady();
    REQUIRE(ready.size() == 1);
    CHECK(ready[0].error_code == StatusCode::kInvalidArgument);
    CHECK(contains(ready[0].error_message, "(request of rank 1)"));
  }
  {  // alltoall: what rank 0 receives from both ranks is too large
    Coordinator c(2);
    for (int r = 0; r < 2; ++r) {
      Request q = request({kMaxTensorBytes / 4});
      q.op = OpType::kAlltoall;
      q.splits = {kMaxTensorBytes / 4, 0};
      c.addRequests(r, {q}, Clock::now());
    }
    auto ready = c.takeReady();
    REQUIRE(ready.size() == 1);
    CHECK(ready[0].error_code == StatusCode::kInvalidArgument);
    CHECK(contains(ready[0].error_message, "too large"));
    CHECK(contains(ready[0].error_message, "on rank 0"));
  }
}

TEST_CASE("fusion never fuses sizes that do not fit int64") {
  auto allreduce = [](const std::string& name, int64_t count) {
    Response r;
    r.names = {name};
    r.counts = {count};
    return r;
  };
  auto out = planFusion({allreduce("a", 4), allreduce("huge", int64_t(1) << 62), allreduce("b", 4),
                         allreduce("neg", -3)},
                        kInt64Max);
  REQUIRE(out.size() == 3);
  CHECK(out[0].names == std::vector<std::string>{"a", "b"});
  FusionBuffer buffer;
  CHECK_THROWS_AS(buffer.reserve(static_cast<size_t>(kInt64Max)), Error);
}

TEST_CASE("a response list the executor could not use is refused when parsed") {
  auto refused = [](const Response& r) {
    ResponseList list;
    list.responses = {r};
    try {
      parseResponseList(serialize(list));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Response ok;
  ok.names = {"a", "b"};
  ok.counts = {1, 2};
  CHECK(refused(ok) == "accepted");
  Response r = ok;
  r.counts = {1};
  CHECK(contains(refused(r), "2 names but 1 counts"));
  r = ok;
  r.counts = {1, -2};
  CHECK(contains(refused(r), "negative"));
  r = ok;
  r.names.clear();
  r.counts.clear();
  CHECK(contains(refused(r), "without a tensor name"));
  r = ok;
  r.error_code = static_cast<StatusCode>(77);
  CHECK(contains(refused(r), "status code 77"));
}
