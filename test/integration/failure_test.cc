// A rank that dies mid-job: the survivors must not hang. Their next op fails within
// TUTTI_TIMEOUT_SECONDS (plus slack), and the error is sticky: every later call reports the
// same first error. Run under tuttirun only (mpirun tears the whole job down on its own).
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace tutti;
using namespace tutti::itest;

TEST_CASE("a peer that dies: no hang, a sticky error that names the failure", "[failure]") {
  requireInit();
  const int me = rank(), n = size();
  if (n < 2) {
    SUCCEED("needs a peer to lose");
    return;
  }
  const char* timeout_env = std::getenv("TUTTI_TIMEOUT_SECONDS");
  const double timeout = timeout_env ? std::atof(timeout_env) : 300.0;
  HostTensor t(DataType::kFloat32, {4});
  t.fill(1.0);
  Handle h = 0;
  REQUIRE(allreduceAsync("warm", t.view(), t.view(), OpOptions(), &h).ok());
  REQUIRE(waitFor(h).ok());
  if (me == n - 1) {
    std::fflush(nullptr);
    std::_Exit(0);  // dies without shutdown, like a crashed trainer
  }
  sleepMillis(300);
  const auto start = std::chrono::steady_clock::now();
  Status s = allreduceAsync("after.death", t.view(), t.view(), OpOptions(), &h);
  const bool submitted = s.ok();  // else refused at once with the sticky error
  if (s.ok()) s = wait(h, -1);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("rank " << me << ": op after rank " << n - 1 << " died: " << describe(s) << " after "
               << took << " s (TUTTI_TIMEOUT_SECONDS=" << timeout << ")");
  CHECK_FALSE(s.ok());
  CHECK(s.code() != StatusCode::kInProgress);
  CHECK(took < timeout + 10.0);
  CHECK(!s.message().empty());
  // A handle's error names its op, tensor and process set.
  if (submitted) CHECK(s.message().find("allreduce 'after.death' (process set 0)") != std::string::npos);
  // Sticky: a later submission reports the same first error (which the handle's message,
  // prefixed with the op, contains).
  Handle h2 = 0;
  Status again = allreduceAsync("after.death.2", t.view(), t.view(), OpOptions(), &h2);
  if (again.ok()) again = wait(h2, timeout + 5.0);
  INFO("then: " << describe(again));
  CHECK(again.code() == s.code());
  CHECK(s.message().find(again.message()) != std::string::npos);
}
