// What a job tells about itself: log levels, settings' sources, the job clock, the
// timeline writer and file modes, the counters after a known sequence of ops.
#include "core/job_clock.h"
#include "core/timeline.h"
#include "test/unit/rank_threads.h"

#include "test/catch.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

namespace tutti {
namespace {

using test::Failures;
using test::RankContext;
using test::runRanks;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A timeline file as written so far: "[", then one event per line, each a whole JSON
// object; "]" only once closed. Returns the event lines.
std::vector<std::string> eventLines(const std::string& text, bool closed) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  CHECK(line == "[");
  while (std::getline(in, line)) {
    if (line == "]") {
      CHECK(closed);
      break;
    }
    if (!line.empty() && line.back() == ',') line.pop_back();
    INFO(line);
    CHECK(line.front() == '{');
    CHECK(line.back() == '}');
    lines.push_back(line);
  }
  if (closed) CHECK(text.size() >= 3);
  if (closed) CHECK(text.compare(text.size() - 3, 3, "\n]\n") == 0);
  return lines;
}

size_t countOf(const std::vector<std::string>& lines, const std::string& needle) {
  size_t n = 0;
  for (const auto& l : lines) n += l.find(needle) != std::string::npos;
  return n;
}

TEST_CASE("TUTTI_LOG_LEVEL takes every level in any case") {
  const char* levels[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i) {
    std::string lower = levels[i], upper = lower, mixed = lower;
    for (auto& c : upper) c = static_cast<char>(std::toupper(c));
    mixed[0] = static_cast<char>(std::toupper(mixed[0]));
    for (const auto& v : {lower, upper, mixed}) {
      std::map<std::string, std::string> env = {{"TUTTI_LOG_LEVEL", v}};
      INFO(v);
      CHECK(static_cast<int>(parseConfig(&env).log_level) == i);
    }
  }
  std::map<std::string, std::string> bad = {{"TUTTI_LOG_LEVEL", "LOUD"}};
  CHECK_THROWS_WITH(parseConfig(&bad), Catch::Contains("TUTTI_LOG_LEVEL='LOUD'"));
}

TEST_CASE("settings in force name where each value came from") {
  std::map<std::string, std::string> env = {{"TUTTI_CYCLE_TIME_MS", "3"},
                                            {"TUTTI_CACHE_CAPACITY", "7"},
                                            {"TUTTI_SECRET", "abcdef"},
                                            {"TUTTI_LAUNCHER_SETTINGS", "TUTTI_CACHE_CAPACITY"}};
  auto lines = settingsInForce(parseConfig(&env));
  CHECK(lines.size() == configTable().size());
  auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
  CHECK(has("TUTTI_CYCLE_TIME_MS=3 (environment)"));
  CHECK(has("TUTTI_CACHE_CAPACITY=7 (tuttirun)"));
  CHECK(has("TUTTI_FUSION_THRESHOLD=134217728 (default)"));
  CHECK(has("TUTTI_SECRET=(set) (environment)"));  // never the secret itself
}

TEST_CASE("the job clock: every rank's offset to rank 0 is within its reported error") {
  for (int n : {1, 2, 4}) {
    auto hub = makeLoopbackHub(n);
    std::vector<JobClock> clocks(n);
    std::vector<std::thread> threads;
    std::vector<int> ranks(n);
    for (int r = 0; r < n; ++r) ranks[r] = r;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto transport = makeLoopbackTransport(hub, r);
        auto control = transport->makeControlPlane(ranks, 0);
        clocks[r] = syncJobClock(*control, deadlineAfter(10));
      });
    for (auto& t : threads) t.join();
    // One process: one steady clock, so every rank's true offset is rank 0's.
    CHECK(clocks[0].error_us == 0);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " of " << n);
      CHECK(clocks[r].error_us >= 0);
      CHECK(std::llabs(clocks[r].offset_us - clocks[0].offset_us) <= clocks[r].error_us + 1);
      CHECK(clocks[r].epoch_us == clocks[0].epoch_us);
      CHECK(clocks[r].now() >= 0);  // job time 0 was rank 0's clock during the exchange
    }
  }
}

TEST_CASE("the timeline writer: valid so far after every flush, closed array at close") {
  const std::string file = "/tmp/tutti_unit_timeline_" + std::to_string(getpid()) + ".json";
  JobClock clock;
  clock.offset_us = -steadyMicros();
  clock.epoch_us = 1234;
  {
    Timeline tl(file, file, 3, clock, true);
    // A file that was just created is valid already (a rank killed at once leaves one).
    CHECK(eventLines(readFile(file), false).size() == 4);
    tl.begin(0, OpType::kAllreduce, "grad \"w\"\n", "PACK");
    tl.end(0, OpType::kAllreduce, "grad \"w\"\n");
    tl.end(0, OpType::kAllreduce, "grad \"w\"\n");  // nothing open: no event
    tl.begin(2, OpType::kBroadcast, "broadcast.x", "NEGOTIATE_BROADCAST", "\"cache\":\"hit\"");
    tl.instant(2, OpType::kBroadcast, "broadcast.x", "WAITING_FOR_RANKS", "\"missing\":[1]");
    tl.cycleMark();
    tl.round(tl.now(), "\"bytes\":8");
    tl.flush();
    auto lines = eventLines(readFile(file), false);  // as a SIGKILL would leave it
    CHECK(lines.size() == 4 + 3 + 3 + 2);
    CHECK(countOf(lines, "\"name\":\"allreduce.grad \\\"w\\\"\\u000a\"") == 1);  // row label
    CHECK(countOf(lines, "\"name\":\"broadcast.x (set 2)\"") == 1);  // no second prefix
    CHECK(countOf(lines, "\"ph\":\"E\"") == 1);
    CHECK(countOf(lines, "\"start_time_since_epoch_in_micros\":1234") == 1);
    CHECK(countOf(lines, "\"name\":\"CYCLE_START\"") == 1);
    CHECK(countOf(lines, "\"name\":\"ROUND\",\"ph\":\"X\"") == 1);
    CHECK(countOf(lines, "\"pid\":3") == lines.size());
    tl.endAll(2, OpType::kBroadcast, "broadcast.x");
    tl.close();
    tl.begin(0, OpType::kAllreduce, "late", "QUEUED");  // after close: nothing
  }
  auto lines = eventLines(readFile(file), true);
  CHECK(lines.size() == 4 + 3 + 3 + 2 + 1);
  std::remove(file.c_str());
}

TEST_CASE("QUEUED is one complete event whichever thread comes first") {
  const std::string file = "/tmp/tutti_unit_queued_" + std::to_string(getpid()) + ".json";
  {
    Timeline tl(file, file, 0, JobClock(), false);
    const int64_t t0 = tl.now();
    tl.queued(0, OpType::kAllreduce, "a", t0);  // submit first (the usual order)
    tl.dequeued(0, OpType::kAllreduce, "a");
    const int64_t t1 = tl.now();
    tl.dequeued(0, OpType::kAllreduce, "b");    // the round first: submit is still on its way
    tl.queued(0, OpType::kAllreduce, "b", t1);
    tl.dequeued(0, OpType::kAllreduce, "c");    // picked up before the timeline knew it
    tl.queued(0, OpType::kAllreduce, "c", tl.now() + 1);  // a later submit: stale, pending
  }
  auto lines = eventLines(readFile(file), true);
  CHECK(countOf(lines, "\"name\":\"QUEUED\",\"ph\":\"X\"") == 2);
  CHECK(countOf(lines, "\"dur\":-") == 0);
  std::remove(file.c_str());
}

TEST_CASE("timeline paths: a directory gives every rank a file, a file path rank 0 only") {
  CHECK(Timeline::fileFor("traces/", 2) == "traces/rank-2.json");
  CHECK(Timeline::fileFor("/tmp", 1) == "/tmp/rank-1.json");  // an existing directory
  CHECK(Timeline::fileFor("/tmp/t.json", 0) == "/tmp/t.json");
  CHECK(Timeline::fileFor("/tmp/t.json", 1) == "");
  CHECK(Timeline::fileFor("DYNAMIC", 0) == "");
  CHECK(Timeline::fileFor("", 0) == "");
  CHECK_THROWS_WITH(Timeline::probe("/proc/no/such/t.json", "/proc/no/such/t.json", 0),
                    Catch::Contains("cannot create /proc/no/such/t.json"));
}

TEST_CASE("a job's timeline shows every phase of each op on every rank, started and stopped at run time") {
  const std::string dir = "/tmp/tutti_unit_timeline_" + std::to_string(getpid()) + "/";
  Failures failures;
  std::atomic<int> started{0}, stopped{0};
  runRanks(2, [&](RankContext& c) {
    std::vector<float> x(3, 1.0f), y(5, 2.0f);
    c.expectOk(test::runOne(c.rt, test::makeTestEntry(OpType::kAllreduce, "before", {3}, DataType::kFloat32, x.data(), x.data())), "before");
    c.expectOk(c.rt.startTimeline(dir, true), "start");
    c.expectOk(c.rt.startTimeline(dir, true), "start again (kept)");
    // Both timelines run before either rank submits: rank 0 must see rank 1's requests.
    ++started;
    for (int k = 0; k < 10000 && started.load() < 2; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    c.expectOk(test::runOne(c.rt, test::makeTestEntry(OpType::kAllreduce, "one", {3}, DataType::kFloat32, x.data(), x.data())), "one");
    std::vector<TensorEntry> group;
    group.push_back(test::makeTestEntry(OpType::kAllreduce, "g.a", {3}, DataType::kFloat32, x.data(), x.data()));
    group.push_back(test::makeTestEntry(OpType::kAllreduce, "g.b", {5}, DataType::kFloat32, y.data(), y.data()));
    Handle h = 0;
    c.expectOk(c.rt.submit(0, std::move(group), nullptr, &h), "group");
    c.expectOk(c.rt.wait(h, -1, nullptr), "group wait");
    c.rt.stopTimeline();
    // Both timelines are stopped before either rank submits: rank 0 must not see rank 1's.
    ++stopped;
    for (int k = 0; k < 10000 && stopped.load() < 2; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    c.expectOk(test::runOne(c.rt, test::makeTestEntry(OpType::kAllreduce, "after", {3}, DataType::kFloat32, x.data(), x.data())), "after");
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    auto lines = eventLines(readFile(dir + "rank-" + std::to_string(rank) + ".json"), true);
    CHECK(countOf(lines, "allreduce.before") == 0);
    CHECK(countOf(lines, "allreduce.after") == 0);
    CHECK(countOf(lines, "\"name\":\"allreduce.one\"") == 1);
    CHECK(countOf(lines, "\"name\":\"QUEUED\",\"ph\":\"X\"") == 3);
    // Threads as ranks share a host: the shm backend serves their CPU ops.
    for (const char* phase : {"NEGOTIATE_ALLREDUCE", "WAIT_FOR_BATCH", "ALLREDUCE",
                              "SHM_ALLREDUCE", "CALLBACK"})
      CHECK(countOf(lines, std::string("\"name\":\"") + phase + "\",\"ph\":\"B\"") == 3);
    // The fused pair goes from the tensors into shared memory and back (no fusion buffer,
    // so no PACK or UNPACK); the lone tensor is reduced in place.
    CHECK(countOf(lines, "\"name\":\"PACK\",\"ph\":\"B\"") == 0);
    CHECK(countOf(lines, "\"name\":\"UNPACK\",\"ph\":\"B\"") == 0);
    CHECK(countOf(lines, "\"ph\":\"B\"") == countOf(lines, "\"ph\":\"E\""));
    CHECK(countOf(lines, "\"name\":\"ROUND\"") >= 2);
    CHECK(countOf(lines, "\"name\":\"CYCLE_START\"") >= 2);
    if (rank == 0) CHECK(countOf(lines, "\"name\":\"REQUEST\"") == 6);  // 3 tensors x 2 ranks
  }
  for (int rank : {0, 1}) std::remove((dir + "rank-" + std::to_string(rank) + ".json").c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("counters after a known sequence of ops") {
  Failures failures;
  std::vector<std::vector<std::pair<std::string, int64_t>>> seen(2);
  runRanks(2, [&](RankContext& c) {
    std::vector<float> x(4, 1.0f), y(6, 1.0f);
    for (int step = 0; step < 3; ++step)  // one miss, then two cache hits
      c.expectOk(test::runOne(c.rt, test::makeTestEntry(OpType::kAllreduce, "w", {4}, DataType::kFloat32, x.data(), x.data())), "w");
    // One fused batch of two tensors (40 bytes), prescaled: packed into the fusion buffer
    // (an unscaled one would go straight from the tensors into shared memory).
    std::vector<TensorEntry> group;
    group.push_back(test::makeTestEntry(OpType::kAllreduce, "g.a", {4}, DataType::kFloat32, x.data(), x.data()));
    group.push_back(test::makeTestEntry(OpType::kAllreduce, "g.b", {6}, DataType::kFloat32, y.data(), y.data()));
    for (auto& e : group) e.request.prescale = 0.5;
    Handle h = 0;
    c.expectOk(c.rt.submit(0, std::move(group), nullptr, &h), "group");
    c.expectOk(c.rt.wait(h, -1, nullptr), "group wait");
    std::vector<int64_t> b(3, c.rank);
    c.expectOk(test::runOne(c.rt, test::makeTestEntry(OpType::kBroadcast, "b", {3}, DataType::kInt64, b.data(), b.data())), "b");
    seen[c.rank] = c.rt.stats();
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
  for (int rank : {0, 1}) {
    std::map<std::string, int64_t> s(seen[rank].begin(), seen[rank].end());
    INFO("rank " << rank);
    CHECK(s["op.allreduce.shm.calls"] == 4);  // threads as ranks share a host: shm
    CHECK(s["op.allreduce.shm.tensors"] == 5);
    CHECK(s["op.allreduce.shm.bytes"] == 3 * 16 + 40);
    CHECK(s["op.broadcast.shm.calls"] == 1);
    CHECK(s["op.broadcast.shm.bytes"] == 24);
    CHECK(s["fusion.batches"] == 1);
    CHECK(s["fusion.tensors"] == 2);
    CHECK(s["fusion.bytes"] == 40);
    CHECK(s["fusion.max_bytes"] == 40);
    CHECK(s["cache.hits"] == 2);
    CHECK(s["cache.misses"] == 4);
    CHECK(s["errors"] == 0);
    CHECK(s["rounds.with_work"] >= 4);  // the last round counts itself after its op completed
    CHECK(s["rounds"] >= s["rounds.with_work"]);
    CHECK(s["time.negotiation_ns"] > 0);
    CHECK(s["time.backend_ns"] > 0);
    CHECK(s["time.pack_ns"] > 0);
    CHECK(s["time.unpack_ns"] > 0);
  }
}

}  // namespace
}  // namespace tutti
