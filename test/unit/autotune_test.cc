// Autotune: the search (pure) and the runtime applying rank 0's choice on every rank.
#include "core/autotune.h"
#include "test/unit/rank_threads.h"

#include "test/catch.h"

#include <cmath>

namespace tutti {
namespace {

// A throughput landscape: best at 64 MiB and 2 ms, 4 KiB and 20 ms far worse.
double landscape(TuneSettings s) {
  const double f = std::log2(static_cast<double>(s.fusion_threshold));
  const double c = std::log2(s.cycle_time_ms);
  return 1e9 / (1 + 0.05 * (f - 26) * (f - 26) + 0.1 * (c - 1) * (c - 1));
}

TEST_CASE("autotune finds the best grid point from bad settings, then stays") {
  Autotuner tuner({4096, 20}, 2, 3);
  TuneSettings s = tuner.current();
  int windows = 0;
  std::vector<double> seen;
  while (!tuner.done() && windows < 1000) {
    // Noise of +-5% that must not fool the median of three.
    const double noise = 1 + 0.05 * std::sin(windows * 1.7);
    s = tuner.observe(landscape(s) * noise * 0.5, 0.5);
    ++windows;
  }
  CHECK(tuner.done());
  CHECK(windows == 2 + (3 + 5 * 4) + 5 * 4 + 2 * 4);  // warm-up, fusion, cycle, cache
  CHECK(s.fusion_threshold == 64ll << 20);
  CHECK(s.cycle_time_ms == 2);
  CHECK(tuner.log().size() == static_cast<size_t>(windows) + 1);
  CHECK(s.cache);  // the landscape ignores it: the starting value stays
  CHECK(tuner.log()[0].rfind("1,warmup,4096,20,1,-1,", 0) == 0);
  CHECK(tuner.log()[windows - 9].rfind(std::to_string(windows - 8) + ",cycle,67108864,5,1,-1,", 0) == 0);
  CHECK(tuner.log()[windows - 1].rfind(std::to_string(windows) + ",cache,67108864,2,0,-1,", 0) == 0);
  CHECK(tuner.log().back().rfind(std::to_string(windows) + ",done,67108864,2,1,-1,", 0) == 0);
  // Done: further windows change nothing.
  CHECK(tuner.observe(1, 1).fusion_threshold == s.fusion_threshold);
}

TEST_CASE("autotune keeps the starting settings when they are the best") {
  Autotuner tuner({128ll << 20, 1}, 0, 1);
  TuneSettings s = tuner.current();
  for (int i = 0; i < 100 && !tuner.done(); ++i)
    s = tuner.observe(s.fusion_threshold == (128ll << 20) && s.cycle_time_ms == 1 ? 2e9 : 1e9, 1);
  CHECK(tuner.done());
  CHECK(s.fusion_threshold == 128ll << 20);
  CHECK(s.cycle_time_ms == 1);
}

TEST_CASE("autotune switches the cache and hierarchical allreduce when that pays, and not otherwise") {
  for (bool cache_pays : {false, true}) {
    TuneSettings start{4096, 20};
    start.hierarchical = 0;
    Autotuner tuner(start, 0, 1);
    TuneSettings s = tuner.current();
    int windows = 0;
    for (; windows < 1000 && !tuner.done(); ++windows) {
      double score = landscape(s) * (s.hierarchical == 1 ? 1.3 : 1);
      if (cache_pays != s.cache) score *= 0.7;  // the wrong cache setting costs 30%
      s = tuner.observe(score, 1);
    }
    INFO("cache pays: " << cache_pays);
    CHECK(tuner.done());
    CHECK(windows == (1 + 5 * 2) + 5 * 2 + 2 * 2 + 2 * 2);
    CHECK(s.cache == cache_pays);
    CHECK(s.hierarchical == 1);
    CHECK(s.fusion_threshold == 64ll << 20);
  }
  // No cache slots, no hierarchical allreduce: neither is a stage.
  Autotuner tuner({4096, 20}, 0, 1, false);
  int windows = 0;
  for (TuneSettings s = tuner.current(); windows < 1000 && !tuner.done(); ++windows)
    s = tuner.observe(landscape(s), 1);
  CHECK(windows == (1 + 5 * 2) + 5 * 2);
  CHECK(tuner.current().cache);
}

TEST_CASE("TUTTI_AUTOTUNE: every rank applies rank 0's settings at the same round; results stay right") {
  for (int n : {2, 3}) {
    test::Failures failures;
    test::runRanks(n, [&](test::RankContext& c) {
      for (int step = 0; step < 300; ++step) {  // every stage, the cache off and on again
        std::vector<std::vector<float>> xs(8, std::vector<float>(64, static_cast<float>(c.rank + step)));
        std::vector<Handle> handles;
        for (int t = 0; t < 8; ++t) {
          Handle h = 0;
          c.expectOk(test::submitOne(c.rt, test::makeTestEntry(OpType::kAllreduce, "t" + std::to_string(t), {64}, DataType::kFloat32, xs[t].data(), xs[t].data()), &h), "submit");
          handles.push_back(h);
        }
        for (Handle h : handles) c.expectOk(c.rt.wait(h, -1, nullptr), "wait");
        const float expected = static_cast<float>(n * step + n * (n - 1) / 2);
        for (auto& x : xs)
          if (x[63] != expected) c.fail("step " + std::to_string(step) + ": " + std::to_string(x[63]));
      }
    }, failures, [](Config& config) {
      config.autotune = true;
      config.fusion_threshold = 256;  // one tensor per call: fusion pays
      config.cycle_time_ms = 5;
      config.autotune_window_seconds = 0;  // a window every kTuneEveryRounds rounds
      config.autotune_warmup_windows = 0;
      config.autotune_samples = 1;
    });
    INFO(n << " ranks");
    CHECK(failures.summary() == "0 failure(s)");
  }
}

}  // namespace
}  // namespace tutti
