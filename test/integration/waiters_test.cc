// Two threads waiting on one handle (docs/c_api.md, "Handles"): exactly one receives the
// op's status and its output, and owns `data`; the other gets TUTTI_ERR_INVALID_ARGUMENT,
// "handle N was already waited on by another thread" (or "unknown handle N" when it came
// after the first had released the handle). Both waiters are asleep in the wait before the
// op can complete: rank 1 submits late (at one rank, the waiters start before the submit).
// Before the fix both got TUTTI_OK and the same pointer, and the output was freed twice.
#include "test/integration/test_util.h"

#include <tutti/tutti.h>

#include "test/catch.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace tutti;
using namespace tutti::itest;

namespace {

constexpr int kRows = 4;
constexpr int kRounds = 4;

// What one waiting thread saw.
struct Outcome {
  tutti_status_t status = TUTTI_ERR_INTERNAL;
  std::string error;
  tutti_result_t result{};
};

// Waits on *handle once it is published, through tutti_wait_result or tutti_wait.
void waitOn(const std::atomic<tutti_handle_t>* handle, bool want_result, Outcome* out) {
  // Until the submitting thread publishes it (rank 1 submits 300 ms late), with a deadline
  // in time: a count of yields lasted less than 300 ms where nothing else ran.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (handle->load() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  out->result.struct_size = sizeof(tutti_result_t);
  out->status = want_result ? tutti_wait_result(handle->load(), kWaitSeconds, &out->result)
                            : tutti_wait(handle->load(), kWaitSeconds);
  out->error = tutti_last_error();
}

// The loser's refusal: it was waiting alongside, or came after the release.
void checkRefused(const Outcome& o, tutti_handle_t h) {
  INFO("status " << tutti_status_string(o.status) << ": '" << o.error << "'");
  CHECK(o.status == TUTTI_ERR_INVALID_ARGUMENT);
  const std::string id = std::to_string(h);
  CHECK((o.error == "handle " + id + " was already waited on by another thread" ||
         o.error == "unknown handle " + id));
  CHECK(o.result.data == nullptr);
}

// An allgather of kRows int32 rows per rank (row r of rank q holds 100 * q + r).
void gatherWithTwoWaiters(const std::string& name, bool first_wants_result) {
  int32_t rows[kRows];
  for (int r = 0; r < kRows; ++r) rows[r] = 100 * rank() + r;
  tutti_tensor_t t{};
  t.data = rows;
  t.dtype = TUTTI_INT32;
  t.ndim = 1;
  t.shape[0] = kRows;
  std::atomic<tutti_handle_t> handle{0};
  Outcome a, b;
  std::thread ta(waitOn, &handle, first_wants_result, &a);
  std::thread tb(waitOn, &handle, true, &b);
  if (rank() == 1) sleepMillis(300);  // the others' waiters are asleep in the wait by then
  tutti_handle_t h = 0;
  const tutti_status_t submitted = tutti_allgather_async(name.c_str(), &t, nullptr, &h);
  handle = submitted == TUTTI_OK ? h : -1;
  ta.join();
  tb.join();
  REQUIRE(submitted == TUTTI_OK);

  INFO(name << ": waiter a " << tutti_status_string(a.status) << " '" << a.error
            << "', waiter b " << tutti_status_string(b.status) << " '" << b.error << "'");
  REQUIRE(((a.status == TUTTI_OK) != (b.status == TUTTI_OK)));  // exactly one
  const Outcome& winner = a.status == TUTTI_OK ? a : b;
  checkRefused(a.status == TUTTI_OK ? b : a, h);
  if (&winner == &a && !first_wants_result) return;  // tutti_wait freed the output itself
  // The winner owns the output: read every row (ASan reports a freed one), then free it.
  REQUIRE(winner.result.data != nullptr);
  CHECK(winner.result.nbytes == int64_t(size()) * kRows * 4);
  CHECK(winner.result.ndim == 1);
  CHECK(winner.result.shape[0] == int64_t(size()) * kRows);
  const auto* got = static_cast<const int32_t*>(winner.result.data);
  for (int q = 0; q < size(); ++q)
    for (int r = 0; r < kRows; ++r) CHECK(got[q * kRows + r] == 100 * q + r);
  tutti_free(winner.result.data);
}

}  // namespace

TEST_CASE("two threads in tutti_wait_result on one allgather: one gets the output", "[waiters]") {
  requireInit();
  for (int i = 0; i < kRounds; ++i) gatherWithTwoWaiters("waiters.rr." + std::to_string(i), true);
}

TEST_CASE("tutti_wait and tutti_wait_result on one allgather: one gets the op", "[waiters]") {
  requireInit();
  for (int i = 0; i < kRounds; ++i) gatherWithTwoWaiters("waiters.wr." + std::to_string(i), false);
}

TEST_CASE("two threads in tutti::wait on one allgather: one gets the Result", "[waiters]") {
  requireInit();
  std::vector<int32_t> rows(kRows, rank());
  TensorView in;
  in.data = rows.data();
  in.dtype = DataType::kInt32;
  in.shape = {kRows};
  Handle h = 0;
  std::atomic<bool> go{false};
  Status sa, sb;
  Result ra, rb;
  // Until the handle is published (rank 1 submits 300 ms late), with a deadline in time.
  auto published = [&go] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!go.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  };
  std::thread ta([&] {
    published();
    sa = wait(h, kWaitSeconds, &ra);
  });
  std::thread tb([&] {
    published();
    sb = wait(h, kWaitSeconds, &rb);
  });
  if (rank() == 1) sleepMillis(300);
  const Status submitted = allgatherAsync("waiters.cpp", in, OpOptions(), &h);
  go = true;
  ta.join();
  tb.join();
  REQUIRE(submitted.ok());
  INFO("a: " << describe(sa) << "; b: " << describe(sb));
  REQUIRE(sa.ok() != sb.ok());
  const Result& won = sa.ok() ? ra : rb;
  const Status& lost = sa.ok() ? sb : sa;
  CHECK(lost.code() == StatusCode::kInvalidArgument);
  CHECK((sa.ok() ? rb : ra).data == nullptr);
  REQUIRE(won.data != nullptr);
  REQUIRE(won.shape == std::vector<int64_t>{int64_t(size()) * kRows});
  const auto* got = static_cast<const int32_t*>(won.data);
  for (int q = 0; q < size(); ++q) CHECK(got[q * kRows] == q);
  std::free(won.data);
}
