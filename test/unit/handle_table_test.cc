// HandleTable and TensorQueue on their own: the lock-free "done" path, one wake-up per
// batch, parts and first errors, callbacks, and the queue's batch take. Threads stand in
// for the API threads and the background thread; every wait has a deadline.
#include "core/handle_table.h"
#include "core/tensor_queue.h"

#include "test/catch.h"

#include <atomic>
#include <thread>
#include <vector>

using namespace tutti;

namespace {

Deadline soon() { return deadlineAfter(10); }

TensorEntry entry(const std::string& name) {
  TensorEntry e;
  e.request.name = name;
  e.request.shape = {4};
  return e;
}

}  // namespace

TEST_CASE("a handle found done is waited on and released without sleeping") {
  HandleTable table;
  auto state = table.create(1, nullptr);
  const Handle id = state->id;
  HandleTable::complete(*state, Status::OK());
  CHECK(state->done.load());
  bool released = false;
  auto found = table.findForWait(id, &released);
  REQUIRE(found == state);
  CHECK(released);
  CHECK(table.find(id) == nullptr);
  CHECK(HandleTable::wait(*found, deadlineAfter(0)).ok());
}

TEST_CASE("an open handle stays known after a wait that times out") {
  HandleTable table;
  auto state = table.create(1, nullptr);
  bool released = true;
  auto found = table.findForWait(state->id, &released);
  CHECK_FALSE(released);
  Status s = HandleTable::wait(*found, deadlineAfter(0.01));
  CHECK(s.code() == StatusCode::kInProgress);
  CHECK(table.find(state->id) == state);
  HandleTable::complete(*state, Status::OK());
  CHECK(HandleTable::wait(*found, deadlineAfter(0)).ok());
}

TEST_CASE("a grouped handle is done after its last part and keeps the first error") {
  HandleTable table;
  auto state = table.create(3, nullptr);
  HandleTable::complete(*state, Status::OK());
  HandleTable::complete(*state, Status(StatusCode::kMismatch, "first"));
  CHECK_FALSE(state->done.load());
  CHECK(HandleTable::wait(*state, deadlineAfter(0)).code() == StatusCode::kInProgress);
  HandleTable::complete(*state, Status(StatusCode::kBackend, "second"));
  REQUIRE(state->done.load());
  Status s = HandleTable::wait(*state, deadlineAfter(0));
  CHECK(s.code() == StatusCode::kMismatch);
  CHECK(s.message() == "first");
  // Done is final: a late failure changes nothing.
  HandleTable::fail(*state, Status(StatusCode::kAborted, "shut down"));
  CHECK(HandleTable::wait(*state, deadlineAfter(0)).message() == "first");
}

TEST_CASE("a batch completed without waking wakes its sleepers with one wake()") {
  HandleTable table;
  constexpr int kWaiters = 6;
  std::vector<std::shared_ptr<HandleState>> states;
  for (int i = 0; i < kWaiters; ++i) states.push_back(table.create(1, nullptr));
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i)
    waiters.emplace_back([&, i] {
      if (HandleTable::wait(*states[i], soon()).ok()) ++ok;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the waiters' spin
  for (int i = 0; i < kWaiters; ++i) HandleTable::complete(*states[i], Status::OK(), false);
  table.wake();
  const auto start = Clock::now();
  for (auto& t : waiters) t.join();
  CHECK(ok == kWaiters);
  CHECK(Clock::now() - start < std::chrono::seconds(5));  // woken, not timed out
}

TEST_CASE("callbacks run once, in completion order, and failAll names each handle's op") {
  HandleTable table;
  std::vector<Handle> called;
  std::vector<Status> statuses;
  auto record = [&](Handle h, const Status& s) {
    called.push_back(h);
    statuses.push_back(s);
  };
  auto a = table.create(1, record);
  auto b = table.create(1, record);
  auto c = table.create(1, record);
  c->name = "grad.c";
  c->process_set = 2;
  HandleTable::complete(*b, Status::OK(), false);
  HandleTable::complete(*a, Status::OK(), false);
  HandleTable::complete(*a, Status::OK());  // done already: no second callback
  table.failAll(Status(StatusCode::kAborted, "Tutti was shut down"));
  REQUIRE(called == std::vector<Handle>{b->id, a->id, c->id});
  CHECK(statuses[2].code() == StatusCode::kAborted);
  CHECK(statuses[2].message() ==
        "allreduce 'grad.c' (process set 2): Tutti was shut down");
  CHECK(HandleTable::wait(*c, deadlineAfter(0)).code() == StatusCode::kAborted);
}

TEST_CASE("waiters and a completing thread race without losing a wake-up") {
  // Many rounds of: a waiter thread per handle, the "background thread" completing them in
  // batches of 4 with one wake() each. A lost wake-up shows as a wait that times out.
  HandleTable table;
  constexpr int kHandles = 64;
  std::vector<std::shared_ptr<HandleState>> states;
  for (int i = 0; i < kHandles; ++i) states.push_back(table.create(1, nullptr));
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (int w = 0; w < 4; ++w)
    waiters.emplace_back([&, w] {
      for (int i = w; i < kHandles; i += 4)
        if (HandleTable::wait(*states[i], soon()).ok()) ++ok;
    });
  std::thread completer([&] {
    for (int i = 0; i < kHandles; ++i) {
      HandleTable::complete(*states[i], Status::OK(), false);
      if (i % 4 == 3) {
        table.wake();
        std::this_thread::yield();
      }
    }
  });
  completer.join();
  for (auto& t : waiters) t.join();
  CHECK(ok == kHandles);
}

TEST_CASE("the queue takes a batch by name in order, and hands out each request once") {
  TensorQueue queue;
  std::vector<TensorEntry> one{entry("a")}, two{entry("b")}, three{entry("c")};
  REQUIRE(queue.add(one).ok());
  REQUIRE(queue.add(two).ok());
  std::vector<const Request*> fresh{nullptr};  // dropped by popNew
  queue.popNew(&fresh);
  REQUIRE(fresh.size() == 2);
  CHECK(fresh[0]->name == "a");
  CHECK(fresh[1]->name == "b");
  CHECK(fresh[1]->shape == std::vector<int64_t>{4});
  const Request* b = fresh[1];  // read in place: the entry's own request until it is taken
  REQUIRE(queue.add(three).ok());
  queue.popNew(&fresh);
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0]->name == "c");
  CHECK(b->name == "b");
  queue.popNew(&fresh);
  CHECK(fresh.empty());
  std::vector<TensorQueue::Taken> taken(1);  // dropped by take()
  queue.take({"c", "missing", "a"}, &taken);
  REQUIRE(taken.size() == 3);
  REQUIRE(taken[0]);
  CHECK(taken[0]->request.name == "c");
  CHECK_FALSE(taken[1]);
  REQUIRE(taken[2]);
  CHECK(taken[2]->request.name == "a");
  CHECK(queue.inFlight() == 1);
  // Run, then given back: the handles and allocators go, the nodes wait for the next entries.
  auto handle = std::make_shared<HandleState>();
  taken[2]->handle = handle;
  bool allocator_alive = true;
  struct Flag {
    bool* alive;
    ~Flag() { *alive = false; }
  };
  auto flag = std::make_shared<Flag>(Flag{&allocator_alive});
  taken[2]->allocator = [flag](const std::vector<int64_t>&) -> void* { return nullptr; };
  flag.reset();
  queue.recycle(&taken);
  CHECK(taken.empty());
  CHECK(handle.use_count() == 1);
  CHECK_FALSE(allocator_alive);
  // A reused entry holds only what the new one says (its request copied whole).
  TensorEntry longer = entry("a-longer-name-than-any-small-string-holds");
  longer.request.shape = {2, 3};
  std::vector<TensorEntry> reused{longer};
  REQUIRE(queue.add(reused).ok());
  CHECK(reused[0].request.name == longer.request.name);  // the request is copied, not moved
  queue.popNew(&fresh);
  REQUIRE(fresh.size() == 1);
  CHECK(*fresh[0] == longer.request);
  queue.take({longer.request.name}, &taken);
  REQUIRE(taken[0]);
  CHECK_FALSE(taken[0]->handle);
  CHECK(taken[0]->request == longer.request);
  queue.recycle(&taken);
  std::vector<TensorEntry> again{entry("b")};
  CHECK(queue.add(again).code() == StatusCode::kDuplicateName);
  CHECK(queue.takeAll().size() == 1);
  queue.popNew(&fresh);
  CHECK(fresh.empty());
}

TEST_CASE("an entry taken before its request is popped is never handed out") {
  // An error agreed from the other ranks' requests completes this rank's entry while its
  // request still waits to be popped; the next entry may reuse that entry's node.
  TensorQueue queue;
  std::vector<TensorEntry> a{entry("a")}, b{entry("b")}, c{entry("c")};
  REQUIRE(queue.add(a).ok());
  REQUIRE(queue.add(b).ok());
  std::vector<TensorQueue::Taken> taken;
  queue.take({"a"}, &taken);
  REQUIRE(taken[0]);
  queue.recycle(&taken);
  REQUIRE(queue.add(c).ok());  // into a's node
  std::vector<const Request*> fresh;
  queue.popNew(&fresh);
  REQUIRE(fresh.size() == 2);
  CHECK(fresh[0]->name == "b");
  CHECK(fresh[1]->name == "c");
  // The same through take(name), and for the last one waiting.
  std::vector<TensorEntry> d{entry("d")};
  REQUIRE(queue.add(d).ok());
  REQUIRE(queue.take("d"));
  queue.popNew(&fresh);
  CHECK(fresh.empty());
  CHECK(queue.inFlight() == 2);
}

TEST_CASE("an agreed error takes only the entries claimed when it was agreed") {
  TensorQueue queue;
  std::vector<TensorEntry> a{entry("a")}, b{entry("b")};
  REQUIRE(queue.add(a).ok());
  queue.claim({"a", "missing"});  // "a" was never popped: it is not handed out any more
  std::vector<const Request*> fresh;
  queue.popNew(&fresh);
  CHECK(fresh.empty());
  // "b" is submitted after the error was agreed on (its request popped by the next round):
  // the error, run later, leaves it in the queue.
  REQUIRE(queue.add(b).ok());
  queue.popNew(&fresh);
  REQUIRE(fresh.size() == 1);
  std::vector<TensorQueue::Taken> taken;
  queue.take({"a", "b"}, &taken, /*claimed_only=*/true);
  REQUIRE(taken.size() == 2);
  REQUIRE(taken[0]);
  CHECK(taken[0]->request.name == "a");
  CHECK_FALSE(taken[1]);
  CHECK(fresh[0]->name == "b");  // still its own entry's request
  queue.recycle(&taken);
  // A node reused by a new entry does not keep the mark.
  std::vector<TensorEntry> c{entry("c")};
  REQUIRE(queue.add(c).ok());
  queue.take({"c"}, &taken, /*claimed_only=*/true);
  CHECK_FALSE(taken[0]);
  CHECK(queue.inFlight() == 2);
}

TEST_CASE("the block pool recycles freed blocks of each size, keeps a bounded number, and outlives its users") {
  auto pool = std::make_shared<BlockPool>(2);
  void* a = pool->get(64);
  void* b = pool->get(64);
  void* c = pool->get(64);
  pool->put(a, 64);
  pool->put(b, 64);
  pool->put(c, 64);  // beyond `keep`: freed
  void* d = pool->get(64);
  void* e = pool->get(64);
  CHECK(((d == a && e == b) || (d == b && e == a)));
  void* big = pool->get(BlockPool::kMaxBlock + 1);  // never pooled
  pool->put(big, BlockPool::kMaxBlock + 1);
  pool->put(d, 64);
  pool->put(e, 64);
  // A handle allocated from the pool keeps it alive after the pool's owner let go.
  std::shared_ptr<HandleState> state =
      std::allocate_shared<HandleState>(PoolAllocator<HandleState>(pool));
  std::weak_ptr<BlockPool> weak = pool;
  pool.reset();
  CHECK(!weak.expired());
  state.reset();
  CHECK(weak.expired());
}
