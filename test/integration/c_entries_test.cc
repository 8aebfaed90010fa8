// The C entries the header-only C++ API stands on (docs/c_api.md): the output allocator and
// the release of user_data (exactly once, also when the call fails), the 0.1 options size,
// the async barrier and join, a set's rank list and dtype sizes. Through tutti.h only.
#include "test/integration/test_util.h"

#include <tutti/tutti.h>

#include "test/catch.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

using namespace tutti;
using namespace tutti::itest;

namespace {

// What the C callbacks of one op saw.
struct Seen {
  std::atomic<int> allocations{0};
  std::atomic<int> callbacks{0};
  std::atomic<int> releases{0};
  std::vector<int64_t> shape;
  std::vector<int32_t> storage;
};

void* allocate(const int64_t* shape, int ndim, void* user) {
  auto* seen = static_cast<Seen*>(user);
  seen->shape.assign(shape, shape + ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  seen->storage.assign(static_cast<size_t>(n + 1), -1);
  ++seen->allocations;
  return seen->storage.data();
}

void called(tutti_handle_t, tutti_status_t, const char*, void* user) {
  ++static_cast<Seen*>(user)->callbacks;
}

void release(void* user) { ++static_cast<Seen*>(user)->releases; }

tutti_op_options_t optionsFor(Seen* seen) {
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  o.user_data = seen;
  o.allocator = allocate;
  o.callback = called;
  o.release = release;
  return o;
}

// A 1-D C tensor of `n` elements of `dtype` at `data`.
tutti_tensor_t flatTensor(void* data, tutti_dtype_t dtype, int64_t n) {
  tutti_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = 1;
  t.shape[0] = n;
  return t;
}

// Waits (bounded) until `counter` reaches `value`: release may run on Tutti's thread just
// after the handle completes.
bool reaches(const std::atomic<int>& counter, int value) {
  for (int i = 0; i < 2000 && counter.load() < value; ++i) sleepMillis(1);
  return counter.load() == value;
}

}  // namespace

TEST_CASE("allgather into the caller's allocator; user_data released once", "[c_entries]") {
  requireInit();
  int32_t rows[3] = {rank(), rank(), rank()};
  tutti_tensor_t t = flatTensor(rows, TUTTI_INT32, 3);
  Seen seen;
  tutti_op_options_t o = optionsFor(&seen);
  tutti_handle_t h = 0;
  REQUIRE(tutti_allgather_async("centries.ag", &t, &o, &h) == TUTTI_OK);
  tutti_result_t r{};
  r.struct_size = sizeof r;
  REQUIRE(tutti_wait_result(h, kWaitSeconds, &r) == TUTTI_OK);
  CHECK(r.data == seen.storage.data());  // the caller's memory, not Tutti's
  CHECK(seen.allocations.load() == 1);
  CHECK(seen.shape == std::vector<int64_t>{3 * int64_t(size())});
  for (int q = 0; q < size(); ++q) CHECK(seen.storage[static_cast<size_t>(3 * q)] == q);
  CHECK(reaches(seen.callbacks, 1));
  CHECK(reaches(seen.releases, 1));

  // tutti_wait leaves the allocator's output alone (ASan: no free of memory Tutti never had).
  Seen again;
  o = optionsFor(&again);
  REQUIRE(tutti_allgather_async("centries.ag.wait", &t, &o, &h) == TUTTI_OK);
  REQUIRE(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  CHECK(again.storage[0] == 0);
  CHECK(reaches(again.releases, 1));
}

TEST_CASE("release runs once when the call fails; the 0.1 options size still works", "[c_entries]") {
  requireInit();
  float x[4] = {1, 2, 3, 4};
  tutti_tensor_t t = flatTensor(x, TUTTI_FLOAT32, 4);
  Seen seen;
  tutti_op_options_t o = optionsFor(&seen);
  o.op = static_cast<tutti_reduce_op_t>(42);  // refused at the C edge
  tutti_handle_t h = 0;
  CHECK(tutti_allreduce_tensor_async("centries.bad_op", &t, &t, &o, &h) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(seen.releases.load() == 1);
  o = optionsFor(&seen);
  o.process_set = 12345;  // refused by the runtime: no such set
  CHECK(tutti_allreduce_tensor_async("centries.no_set", &t, &t, &o, &h) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(seen.releases.load() == 2);
  CHECK(seen.callbacks.load() == 0);

  // A caller built against 0.1 passes the old size: its options work, the new fields unread.
  Seen old;
  o = optionsFor(&old);
  o.struct_size = TUTTI_OP_OPTIONS_SIZE_0_1;
  o.allocator = reinterpret_cast<void* (*)(const int64_t*, int, void*)>(1);  // never read
  o.release = reinterpret_cast<void (*)(void*)>(1);
  REQUIRE(tutti_allreduce_tensor_async("centries.v01", &t, &t, &o, &h) == TUTTI_OK);
  REQUIRE(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  CHECK(x[3] == 4.0f * size());
  CHECK(reaches(old.callbacks, 1));
  CHECK(old.releases.load() == 0);
}

TEST_CASE("ordered ops are agreed by position; the 0.2 options size leaves them by name",
          "[c_entries]") {
  requireInit();
  int64_t before = 0;
  REQUIRE(tutti_stat("ordered.agreed", &before) == TUTTI_OK);
  float x[3] = {1, 2, 3};
  tutti_tensor_t t = flatTensor(x, TUTTI_FLOAT32, 3);
  tutti_op_options_t o;
  tutti_op_options_init(&o);
  CHECK(o.ordered == 0);  // by name unless asked
  o.ordered = 1;
  tutti_handle_t h = 0;
  REQUIRE(tutti_allreduce_tensor_async("centries.ordered.0", &t, &t, &o, &h) == TUTTI_OK);
  REQUIRE(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  CHECK(x[2] == 3.0f * size());
  int64_t after = 0;
  REQUIRE(tutti_stat("ordered.agreed", &after) == TUTTI_OK);
  CHECK(after == before + 1);
  // A caller built against 0.2 passes the old size: the op is matched by name.
  o.struct_size = TUTTI_OP_OPTIONS_SIZE_0_2;
  REQUIRE(tutti_allreduce_tensor_async("centries.ordered.1", &t, &t, &o, &h) == TUTTI_OK);
  REQUIRE(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  REQUIRE(tutti_stat("ordered.agreed", &after) == TUTTI_OK);
  CHECK(after == before + 1);
}

TEST_CASE("async barrier and join, set ranks, dtype sizes", "[c_entries]") {
  requireInit();
  tutti_handle_t h = 0;
  REQUIRE(tutti_barrier_async(TUTTI_GLOBAL_PROCESS_SET, &h) == TUTTI_OK);
  CHECK(tutti_wait(h, kWaitSeconds) == TUTTI_OK);
  REQUIRE(tutti_join_async(TUTTI_GLOBAL_PROCESS_SET, &h) == TUTTI_OK);
  tutti_result_t r{};
  r.struct_size = sizeof r;
  REQUIRE(tutti_wait_result(h, kWaitSeconds, &r) == TUTTI_OK);
  CHECK(r.last_joined_rank >= 0);
  CHECK(r.last_joined_rank < size());

  int n = -1;
  REQUIRE(tutti_process_set_ranks(TUTTI_GLOBAL_PROCESS_SET, nullptr, 0, &n) == TUTTI_OK);
  CHECK(n == size());
  std::vector<int> ranks(static_cast<size_t>(size()) + 2, -7);
  REQUIRE(tutti_process_set_ranks(TUTTI_GLOBAL_PROCESS_SET, ranks.data(), 1, &n) == TUTTI_OK);
  CHECK(n == size());
  CHECK(ranks[0] == 0);
  CHECK(ranks[1] == -7);  // only `capacity` written
  REQUIRE(tutti_process_set_ranks(TUTTI_GLOBAL_PROCESS_SET, ranks.data(), size() + 2, &n) == TUTTI_OK);
  for (int i = 0; i < size(); ++i) CHECK(ranks[static_cast<size_t>(i)] == i);
  CHECK(ranks[static_cast<size_t>(size())] == -7);
  CHECK(tutti_process_set_ranks(777, ranks.data(), 1, &n) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::string(tutti_last_error()) == "process_set_ranks: process set 777 does not exist");
  CHECK(tutti_process_set_ranks(0, nullptr, 3, &n) == TUTTI_ERR_INVALID_ARGUMENT);

  CHECK(tutti_dtype_size(TUTTI_BOOL) == 1);
  CHECK(tutti_dtype_size(TUTTI_BFLOAT16) == 2);
  CHECK(tutti_dtype_size(TUTTI_FLOAT32) == 4);
  CHECK(tutti_dtype_size(TUTTI_INT64) == 8);
  CHECK(tutti_dtype_size(static_cast<tutti_dtype_t>(99)) == 0);
}
