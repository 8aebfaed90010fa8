// Lifecycle across real processes: calls before init, idempotent init and shutdown, calls
// after shutdown, and a second init in the same process that works. One test case, run in
// order, because the state it checks is per process.
#include "test/integration/test_util.h"

#include "test/catch.h"

using namespace tutti;
using namespace tutti::itest;

namespace {

void allreduceWorks(const std::string& name) {
  HostTensor t(DataType::kInt64, {3}), x(DataType::kInt64, {3});
  t.fill(rank() + 1);
  x.fill(size() * (size() + 1) / 2);
  Handle h = 0;
  Status s = allreduceAsync(name, t.view(), t.view(), OpOptions(), &h);
  INFO("rank " << rank() << ": allreduce '" << name << "': " << describe(s));
  REQUIRE(s.ok());
  CHECK(describe(waitFor(h)) == "kOk");
  CHECK(compare(x, t.data(), 3, name) == "");
}

void expectNotInitialized(const char* when) {
  INFO(when);
  float buf[2] = {1, 2};
  tutti_handle_t h = 0;
  CHECK_FALSE(isInitialized());
  CHECK(tutti_is_initialized() == 0);
  CHECK(tutti_rank() == -1);
  CHECK(tutti_allreduce_async("x", buf, buf, 2, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h) ==
        TUTTI_ERR_NOT_INITIALIZED);
  CHECK(std::string(tutti_last_error()).size() > 0);
  CHECK(tutti_broadcast_async("x", buf, 2, TUTTI_FLOAT32, 0, &h) == TUTTI_ERR_NOT_INITIALIZED);
  CHECK(tutti_barrier(TUTTI_GLOBAL_PROCESS_SET, 1.0) == TUTTI_ERR_NOT_INITIALIZED);
  int last = 0;
  CHECK(tutti_join(TUTTI_GLOBAL_PROCESS_SET, 1.0, &last) == TUTTI_ERR_NOT_INITIALIZED);
  int id = 0, zero = 0;
  CHECK(tutti_add_process_set(&zero, 1, &id) == TUTTI_ERR_NOT_INITIALIZED);
  TensorView v;
  v.data = buf;
  v.shape = {2};
  Handle hh = 0;
  CHECK(allreduceAsync("x", v, v, OpOptions(), &hh).code() == StatusCode::kNotInitialized);
  CHECK(allgatherAsync("x", v, OpOptions(), &hh).code() == StatusCode::kNotInitialized);
  CHECK(barrierAsync(TUTTI_GLOBAL_PROCESS_SET, &hh).code() == StatusCode::kNotInitialized);
}

}  // namespace

TEST_CASE("not initialized, init, idempotence, shutdown, init again", "[lifecycle]") {
  expectNotInitialized("before the first init");

  requireInit();
  const int world_rank = rank(), world_size = size();
  CHECK(world_rank >= 0);
  CHECK(world_rank < world_size);
  CHECK(tutti_rank() == world_rank);
  CHECK(tutti_size() == world_size);
  CHECK(localRank() >= 0);
  CHECK(localRank() < localSize());
  CHECK(crossRank() >= 0);
  CHECK(crossRank() < crossSize());
  CHECK(localSize() * crossSize() == world_size);  // one host
  CHECK(!cpuBackend().empty());
  CHECK(std::string(tutti_cpu_backend()) == cpuBackend());
  INFO("backend " << cpuBackend());
  CHECK(backendBuilt(cpuBackend()));
  CHECK(tutti_init() == TUTTI_OK);  // idempotent
  CHECK(init().ok());
  CHECK(rank() == world_rank);
  allreduceWorks("life.first");

  CHECK(shutdown().ok());
  CHECK(tutti_shutdown() == TUTTI_OK);  // idempotent
  CHECK(shutdown().ok());
  expectNotInitialized("after shutdown");

  requireInit();  // a second life in the same process
  CHECK(rank() == world_rank);
  CHECK(size() == world_size);
  allreduceWorks("life.second");
  allreduceWorks("life.first");  // names of the first life mean nothing now
  CHECK(tutti_barrier(TUTTI_GLOBAL_PROCESS_SET, kWaitSeconds) == TUTTI_OK);
}
