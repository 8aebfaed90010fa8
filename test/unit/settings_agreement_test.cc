// The settings every rank must give alike: the line, the verdict (pure), and init of whole
// Runtimes with threads as ranks over loopback, where a mismatch fails init on every rank.
#include "core/settings_agreement.h"

#include "test/catch.h"
#include "test/unit/rank_threads.h"

#include <string>
#include <vector>

using namespace tutti;
using tutti::test::Failures;

namespace {

using Env = std::map<std::string, std::string>;

std::string lineOf(const Env& env) {
  Config c = parseConfig(&env);
  return settingsLine(c);
}

// Runs `n` Runtimes as threads; rank r's config is changed by tweak(r, config). Returns each
// rank's init error ("" when init succeeded, after one allreduce that must give n).
std::vector<Status> initRanks(int n, const std::function<void(int, Config&)>& tweak,
                              Failures& failures) {
  auto hub = makeLoopbackHub(n);
  std::vector<Status> out(n);
  test::runThreads(n, failures, [&](int r) {
    Config c = test::testConfig(r, n);
    c.start_timeout_seconds = 10;
    tweak(r, c);
    std::unique_ptr<Runtime> rt;
    try {
      rt = std::make_unique<Runtime>(c, makeLoopbackTransport(hub, r));
    } catch (const Error& e) {
      out[r] = e.status();
      return;
    }
    float one = 1, sum = 0;
    Status s = test::runOne(*rt, test::makeTestEntry(OpType::kAllreduce, "x", {1},
                                                     DataType::kFloat32, &one, &sum));
    if (!s.ok() || sum != static_cast<float>(n))
      failures.add("rank " + std::to_string(r) + ": allreduce gave " + std::to_string(sum) +
                   " (" + s.message() + ")");
    rt->shutdown();
  });
  return out;
}

}  // namespace

TEST_CASE("settingsLine: every must-agree variable, by value in force") {
  const std::string line = lineOf({});
  CHECK(line.find("TUTTI_FUSION_THRESHOLD=134217728") != std::string::npos);
  CHECK(line.find("TUTTI_CACHE_CAPACITY=1024") != std::string::npos);
  CHECK(line.find("TUTTI_AUTOTUNE=0") != std::string::npos);
  // Written differently, the same value: the same line (default given explicitly, a bool
  // spelt "true", a HOROVOD_ twin).
  CHECK(lineOf({{"TUTTI_CACHE_CAPACITY", "1024"}, {"TUTTI_AUTOTUNE", "no"}}) == line);
  CHECK(lineOf({{"TUTTI_AUTOTUNE", "true"}}) == lineOf({{"HOROVOD_AUTOTUNE", "1"}}));
  // Only the must-agree ones: a rank's own settings may differ.
  CHECK(lineOf({{"TUTTI_CYCLE_TIME_MS", "7"}, {"TUTTI_LOG_LEVEL", "error"}}) == line);
  for (const auto& var : configTable()) {
    INFO(var.name);
    CHECK((var.across == AcrossRanks::kMustAgree) == static_cast<bool>(var.value));
  }
}

TEST_CASE("settingsMismatch names the variable, the ranks and both values") {
  const std::string base = lineOf({});
  const std::string small = lineOf({{"TUTTI_CACHE_CAPACITY", "1000"}});
  CHECK(settingsMismatch({base}).empty());
  CHECK(settingsMismatch({base, base, base}).empty());
  std::string m = settingsMismatch({base, small});
  CHECK(m.find("TUTTI_CACHE_CAPACITY is 1000 on rank 1 but 1024 on rank 0") != std::string::npos);
  CHECK(m.find("set it the same on every rank") != std::string::npos);
  CHECK(m.find("FUSION") == std::string::npos);
  // Several ranks and several variables: one clause per variable, the first rank named.
  const std::string both = lineOf({{"TUTTI_CACHE_CAPACITY", "8"}, {"TUTTI_FUSION_THRESHOLD", "0"}});
  m = settingsMismatch({base, base, both, both});
  CHECK(m.find("TUTTI_FUSION_THRESHOLD is 0 on rank 2 but 134217728 on rank 0 (it differs "
               "from rank 0's on 2 ranks: 2, 3)") != std::string::npos);
  CHECK(m.find("TUTTI_CACHE_CAPACITY is 8 on rank 2 but 1024 on rank 0") != std::string::npos);
  // Rank 0 is the odd one out: the others are named against it.
  m = settingsMismatch({lineOf({{"TUTTI_AUTOTUNE", "1"}}), base});
  CHECK(m.find("TUTTI_AUTOTUNE is 0 on rank 1 but 1 on rank 0") != std::string::npos);
}

TEST_CASE("settingsMismatch does not trust another rank's line") {
  const std::string base = lineOf({});
  CHECK(settingsMismatch({base, "garbage"}).find("settings from rank 1 are malformed") !=
        std::string::npos);
  CHECK(settingsMismatch({base, std::string("TUTTI_AUTOTUNE=\x01", 16)})
            .find("rank 1 are malformed") != std::string::npos);
  CHECK(settingsMismatch({base, "=1"}).find("malformed") != std::string::npos);
  CHECK(settingsMismatch({base, std::string(100000, 'a') + "=1"}).find("malformed") !=
        std::string::npos);
  // A variable the other build does not know (an empty line: a build without any).
  CHECK(settingsMismatch({base, ""}).find("TUTTI_CACHE_CAPACITY is (not known to that "
                                          "rank's build) on rank 1") != std::string::npos);
}

TEST_CASE("init fails on every rank when a must-agree setting differs; others may differ") {
  struct Case {
    const char* what;
    std::function<void(Config&)> odd;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"cache capacity 1000 vs 1024", [](Config& c) { c.cache_capacity = 1000; },
       "TUTTI_CACHE_CAPACITY is 1000 on rank 1 but 1024 on rank 0"},
      {"cache capacity 8 vs 1024", [](Config& c) { c.cache_capacity = 8; },
       "TUTTI_CACHE_CAPACITY is 8 on rank 1"},
      {"cache off on one rank", [](Config& c) { c.cache_capacity = 0; },
       "TUTTI_CACHE_CAPACITY is 0 on rank 1"},
      {"fusion off on one rank", [](Config& c) { c.fusion_threshold = 0; },
       "TUTTI_FUSION_THRESHOLD is 0 on rank 1 but 134217728 on rank 0"},
      {"autotune on one rank", [](Config& c) { c.autotune = true; },
       "TUTTI_AUTOTUNE is 1 on rank 1 but 0 on rank 0"},
  };
  for (const auto& k : cases) {
    SECTION(k.what) {
      Failures failures;
      auto got = initRanks(3, [&](int r, Config& c) { if (r == 1) k.odd(c); }, failures);
      INFO(failures.summary());
      CHECK(failures.list().empty());
      for (int r = 0; r < 3; ++r) {
        INFO("rank " << r << ": " << got[r].message());
        CHECK(got[r].code() == StatusCode::kMismatch);
        CHECK(got[r].message().find(k.expect) != std::string::npos);
      }
    }
  }
  SECTION("settings of each rank's own") {
    Failures failures;
    auto got = initRanks(3, [](int r, Config& c) {
      c.cycle_time_ms = 1 + r;
      c.timeout_seconds = 30 + r;
      c.pipeline = r == 1 ? "1" : "0";
    }, failures);
    INFO(failures.summary());
    CHECK(failures.list().empty());
    for (int r = 0; r < 3; ++r) CHECK(got[r].ok());
  }
}
