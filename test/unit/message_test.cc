#include "core/message.h"

#include "test/catch.h"

using namespace tutti;

TEST_CASE("request lists round-trip through the wire format") {
  RequestList list;
  list.shutdown = true;
  Request a;
  a.op = OpType::kAlltoall;
  a.dtype = DataType::kBFloat16;
  a.reduce_op = ReduceOp::kProduct;
  a.device = DeviceType::kCuda;
  a.root = 3;
  a.prescale = 0.5;
  a.postscale = 1.0 / 3;
  a.name = "grad/w1 with spaces and \xc3\xa9";
  a.shape = {4, 0, 9};
  a.splits = {1, 2, 1};
  a.group = "g";
  a.group_size = 2;
  list.requests = {a, Request()};
  RequestList back = parseRequestList(serialize(list));
  CHECK(back.shutdown);
  REQUIRE(back.requests.size() == 2);
  CHECK(back.requests[0] == a);
  CHECK(back.requests[1] == Request());
}

TEST_CASE("response lists round-trip through the wire format") {
  ResponseList list;
  list.fatal_error = "stall";
  Response r;
  r.type = ResponseType::kError;
  r.op = OpType::kAllgather;
  r.names = {"a", "b"};
  r.counts = {3, 0};
  r.dtype = DataType::kInt8;
  r.first_dims = {1, 2, 3};
  r.splits = {4, 5};
  r.value = 7;
  r.error_code = StatusCode::kMismatch;
  r.error_message = "allgather 'a': dtype ...";
  list.responses = {r};
  ResponseList back = parseResponseList(serialize(list));
  CHECK(back.fatal_error == "stall");
  REQUIRE(back.responses.size() == 1);
  const Response& b = back.responses[0];
  CHECK(b.type == r.type);
  CHECK(b.op == r.op);
  CHECK(b.names == r.names);
  CHECK(b.counts == r.counts);
  CHECK(b.first_dims == r.first_dims);
  CHECK(b.splits == r.splits);
  CHECK(b.value == 7);
  CHECK(b.error_code == StatusCode::kMismatch);
  CHECK(b.error_message == r.error_message);
}

TEST_CASE("malformed messages are errors, not crashes") {
  RequestList list;
  list.requests.resize(3);
  list.requests[1].name = "x";
  std::string bytes = serialize(list);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    CHECK_THROWS_AS(parseRequestList(bytes.substr(0, cut)), Error);
  CHECK_THROWS_AS(parseRequestList(bytes + "x"), Error);
  std::string bad_op = bytes;
  bad_op[9] = static_cast<char>(99);  // first request's op byte
  CHECK_THROWS_AS(parseRequestList(bad_op), Error);
  CHECK_THROWS_AS(parseResponseList(bytes), Error);  // wrong magic
}
