// The negotiator of one process set with threads as ranks over the loopback control plane:
// what every member agrees on, round by round (cache hits, misses, stale slots, join, a
// fatal stall verdict).
#include "core/negotiator.h"

#include "backends/loopback/loopback.h"
#include "test/backends/backend_test_util.h"
#include "test/catch.h"

#include <cstdint>
#include <functional>
#include <thread>

using namespace tutti;
using tutti::test::Failures;

namespace {

constexpr int64_t kCapacity = 70;  // two words per section: slots past 64 work too

// One member: its queue, its negotiator, the set's control plane.
struct Member {
  int rank, size;
  std::unique_ptr<ControlPlane> control;
  TensorQueue queue;
  Negotiator negotiator;

  Member(std::shared_ptr<LoopbackHub> hub, int r, int n)
      : rank(r), size(n), control(makeLoopbackTransport(hub, r)->makeControlPlane(all(n), 0)),
        negotiator(0, r, n, kCapacity) {}

  static std::vector<int> all(int n) {
    std::vector<int> ranks(n);
    for (int i = 0; i < n; ++i) ranks[i] = i;
    return ranks;
  }

  // Submits `requests`, runs one round (contribute, AND, agree) and takes the agreed entries
  // out of the queue as the executor would.
  Agreement round(std::vector<Request> requests, const std::string& stall = "") {
    std::vector<TensorEntry> entries;
    for (auto& q : requests) entries.push_back(TensorEntry{std::move(q), nullptr, nullptr, {}, {}});
    if (!entries.empty()) {
      Status s = queue.add(entries);
      if (!s.ok()) throwError(s.code(), s.message());
    }
    RoundBits bits(1, kCapacity);
    int64_t hits = 0, misses = 0;
    std::vector<const Request*> fresh;
    queue.popNew(&fresh);
    negotiator.contribute(fresh, stall, bits, 0, nullptr, &hits, &misses);
    control->allreduceAnd(bits.words(), deadlineAfter(10));
    Agreement a = negotiator.agree(bits, 0, *control, queue, deadlineAfter(10), nullptr);
    for (const auto& r : a.responses)
      for (const auto& name : r.names) queue.take(name);
    return a;
  }
};

Request req(const std::string& name, std::vector<int64_t> shape = {4}) {
  Request q;
  q.name = name;
  q.shape = std::move(shape);
  return q;
}

Request join() {
  Request q;
  q.op = OpType::kJoin;
  return q;
}

// The agreed responses, " allreduce a broadcast! b" (! an error).
std::string responses(const Agreement& a) {
  std::string out;
  for (const auto& r : a.responses) {
    out += std::string(" ") + opTypeName(r.op) + (r.type == ResponseType::kError ? "!" : "");
    for (const auto& name : r.names) out += " " + name;
  }
  return out;
}

std::string describe(const Agreement& a) {
  return std::to_string(a.cached) + " cached:" + responses(a);
}

// Runs body(member) on n threads, one member each; every failure is collected.
void runMembers(int n, const std::function<void(Member&, Failures&)>& body) {
  Failures failures;
  auto hub = makeLoopbackHub(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Member m(hub, r, n);
        body(m, failures);
      } catch (const std::exception& e) {
        failures.add("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  INFO(failures.summary());
  CHECK(failures.list().empty());
}

// Fails when view(a) (describe: cache hits and responses) is not `expected`.
void expect(Failures& f, const Member& m, const Agreement& a, const std::string& expected,
            const char* step, std::string (*view)(const Agreement&) = describe) {
  if (view(a) != expected)
    f.add("rank " + std::to_string(m.rank) + ", " + step + ": expected '" + expected +
          "', got '" + view(a) + "'");
}

}  // namespace

TEST_CASE("negotiator: the first round negotiates, a repeat comes from the cache alone") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    runMembers(n, [n](Member& m, Failures& f) {
      // Submission order differs by rank; the agreed order is rank 0's decision order: a
      // name is ready when the last rank's request for it arrives (rank n-1 decides).
      auto first = m.round(m.rank % 2 ? std::vector<Request>{req("b"), req("a")}
                                       : std::vector<Request>{req("a"), req("b")});
      const std::string order = (n - 1) % 2 ? "allreduce b allreduce a" : "allreduce a allreduce b";
      expect(f, m, first, "0 cached: " + order, "first round");
      // The cache serves the repeat in slot order, which is the order the slots were filled.
      auto again = m.round({req("b"), req("a")});
      expect(f, m, again, "2 cached: " + order, "repeat");
      if (again.negotiation != Clock::duration::zero())
        f.add("rank " + std::to_string(m.rank) + ": a round of cache hits gathered");
      auto idle = m.round({});
      expect(f, m, idle, "0 cached:", "idle round");
      if (idle.active) f.add("rank " + std::to_string(m.rank) + ": an idle round was active");
    });
  }
}

TEST_CASE("negotiator: a cached op runs once every member holds it") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    runMembers(n, [](Member& m, Failures& f) {
      m.round({req("a")});
      // Only rank 0 submits again: its hit waits (nothing runs anywhere).
      auto waiting = m.round(m.rank == 0 ? std::vector<Request>{req("a")} : std::vector<Request>{});
      expect(f, m, waiting, "0 cached:", "hit on rank 0 only");
      auto ready = m.round(m.rank == 0 ? std::vector<Request>{} : std::vector<Request>{req("a")});
      expect(f, m, ready, "1 cached: allreduce a", "hit on every rank");
    });
  }
}

TEST_CASE("negotiator: a changed shape invalidates the slot on every member and fails as a "
          "mismatch") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    runMembers(n, [](Member& m, Failures& f) {
      m.round({req("a"), req("b")});
      // Rank 1 changes a's shape: a miss there, a hit elsewhere; b stays cached.
      auto changed = m.round({req("a", m.rank == 1 ? std::vector<int64_t>{5}
                                                   : std::vector<int64_t>{4}),
                              req("b")});
      expect(f, m, changed, "1 cached: allreduce b allreduce! a", "changed shape");
      // The slot is gone: the next a is negotiated in full, and agrees again.
      auto after = m.round({req("a")});
      if (after.cached != 0 || after.responses.size() != 1 ||
          after.responses[0].type != ResponseType::kOp)
        f.add("rank " + std::to_string(m.rank) + ": after the mismatch: " + describe(after));
    });
  }
}

TEST_CASE("negotiator: another op under a cached name invalidates the slot in the same round "
          "and fails as a mismatch") {
  runMembers(2, [](Member& m, Failures& f) {
    m.round({req("a")});
    // Rank 1 asks for an allgather 'a' (never cached) where rank 0 hits the allreduce 'a':
    // the slot goes stale at once, and the coordinator reports the mismatch this round.
    Request q = req("a");
    if (m.rank == 1) q.op = OpType::kAllgather;
    auto mixed = m.round({q});
    if (mixed.cached != 0 || mixed.responses.size() != 1 ||
        mixed.responses[0].type != ResponseType::kError ||
        mixed.responses[0].error_message.find("'a'") == std::string::npos)
      f.add("rank " + std::to_string(m.rank) + ": expected the mismatch of 'a' reported in "
            "the same round, got '" + describe(mixed) + "'");
  });
}

TEST_CASE("negotiator: forget() drops the requests it reads in place; the cache stays") {
  runMembers(2, [](Member& m, Failures& f) {
    m.round({req("a"), req("b")});
    // Rank 0's hit on 'a' waits for rank 1, then the set's entries go (a removed set).
    auto waiting = m.round(m.rank == 0 ? std::vector<Request>{req("a")} : std::vector<Request>{});
    expect(f, m, waiting, "0 cached:", "hit on rank 0 only");
    m.negotiator.forget();
    m.queue.takeAll();
    if (m.negotiator.hasDemoted()) f.add("rank " + std::to_string(m.rank) + ": demoted after forget");
    // Nothing of the forgotten hit is read again; the cached slots still serve both names.
    auto again = m.round({req("a"), req("b")});
    expect(f, m, again, "2 cached: allreduce a allreduce b", "after forget");
  });
}

// The tensors of one grouped allreduce: the group's key names its first tensor and size.
std::vector<Request> group(const std::vector<std::string>& names,
                           const std::vector<std::vector<int64_t>>& shapes = {}) {
  std::vector<Request> qs;
  for (size_t i = 0; i < names.size(); ++i) {
    Request q = req(names[i], i < shapes.size() ? shapes[i] : std::vector<int64_t>{4});
    q.group = names[0] + "/" + std::to_string(names.size());
    q.group_size = static_cast<int32_t>(names.size());
    qs.push_back(std::move(q));
  }
  return qs;
}

TEST_CASE("negotiator: a grouped allreduce repeats from the cache, whole") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    runMembers(n, [](Member& m, Failures& f) {
      expect(f, m, m.round(group({"a", "b", "c"})), "0 cached: allreduce a allreduce b allreduce c",
             "first round");
      auto again = m.round(group({"a", "b", "c"}));
      expect(f, m, again, "3 cached: allreduce a allreduce b allreduce c", "repeat");
      if (again.negotiation != Clock::duration::zero())
        f.add("rank " + std::to_string(m.rank) + ": a round of cached groups gathered");
      // The same tensor outside the group is another signature: negotiated in full.
      expect(f, m, m.round({req("a")}), "0 cached: allreduce a", "a alone");
    });
  }
}

TEST_CASE("negotiator: a group of which some tensors hit and some miss is negotiated whole") {
  // The demoted hits follow the misses into the gather: either order is rank 0's to pick.
  auto either = [](Failures& f, const Member& m, const Agreement& a, const std::string& x,
                   const std::string& y, const char* step) {
    const std::string got = describe(a);
    if (got != "0 cached: " + x + " " + y && got != "0 cached: " + y + " " + x)
      f.add("rank " + std::to_string(m.rank) + ", " + step + ": got '" + got + "'");
  };
  for (int n : {2, 3}) {
    CAPTURE(n);
    runMembers(n, [&](Member& m, Failures& f) {
      m.round(group({"a", "b"}));
      // The same key ("a/2"), a new second tensor: a hits, c misses; a goes with c (the
      // coordinator would wait for the group's a forever otherwise).
      either(f, m, m.round(group({"a", "c"})), "allreduce a", "allreduce c", "a hit and a miss");
      // One rank changes b's shape: its b misses (the slot goes stale everywhere), every
      // member negotiates the whole group: b fails on every rank, a (agreed) runs.
      m.round(group({"a", "b"}));
      auto changed = m.round(group({"a", "b"}, {{4}, m.rank == 1 ? std::vector<int64_t>{5}
                                                                 : std::vector<int64_t>{4}}));
      either(f, m, changed, "allreduce a", "allreduce! b", "the changed group");
      either(f, m, m.round(group({"a", "b"})), "allreduce a", "allreduce b", "after the mismatch");
      expect(f, m, m.round(group({"a", "b"})), "2 cached: allreduce a allreduce b",
             "cached again");
    });
  }
}

TEST_CASE("negotiator: while a rank has joined, hits are negotiated in full; join is answered "
          "once every member joined") {
  runMembers(3, [](Member& m, Failures& f) {
    m.round({req("x")});
    // Rank 0 joins; the others submit x again (a cache hit each), which must reach the
    // coordinator so that it counts rank 0 as joined for it.
    auto first =
        m.round(m.rank == 0 ? std::vector<Request>{join()} : std::vector<Request>{req("x")});
    expect(f, m, first, "0 cached: allreduce x", "rank 0 joined");
    auto second = m.round(m.rank == 0 ? std::vector<Request>{} : std::vector<Request>{join()});
    expect(f, m, second, "0 cached: join join.noname.0", "everyone joined");
    if (second.responses.size() == 1 && second.responses[0].value != 2)
      f.add("rank " + std::to_string(m.rank) + ": last joined rank " +
            std::to_string(second.responses[0].value) + ", expected 2");
    auto later = m.round({req("x")});  // the cache serves again once the join is done
    expect(f, m, later, "1 cached: allreduce x", "after the join");
  });
}

TEST_CASE("negotiator: rank 0's fatal stall verdict reaches every member") {
  runMembers(3, [](Member& m, Failures& f) {
    const std::string verdict = "timeout: allreduce 'w' (process set 0) has waited 9 s";
    try {
      m.round({}, m.rank == 0 ? verdict : "");
      f.add("rank " + std::to_string(m.rank) + ": no error");
    } catch (const Error& e) {
      if (e.code() != StatusCode::kTimeout || std::string(e.what()) != verdict)
        f.add("rank " + std::to_string(m.rank) + ": got '" + e.what() + "'");
    }
  });
}

TEST_CASE("negotiator: cache slots past the first word of bits are found, in slot order") {
  runMembers(2, [](Member& m, Failures& f) {
    std::vector<Request> many;
    for (int i = 0; i < 67; ++i) many.push_back(req("t" + std::to_string(100 + i)));
    auto first = m.round(many);
    auto again = m.round(many);
    std::string expected = "67 cached:";
    for (const auto& r : first.responses) expected += " allreduce " + r.names[0];
    expect(f, m, again, expected, "67 hits");
  });
}

TEST_CASE("negotiator: with the cache switched off every op is negotiated; back on, it starts "
          "empty") {
  runMembers(2, [](Member& m, Failures& f) {
    m.round({req("a")});
    // Rank 0 holds a hit that waits for rank 1 when the switch comes: it is negotiated.
    expect(f, m, m.round(m.rank == 0 ? std::vector<Request>{req("a")} : std::vector<Request>{}),
           "0 cached:", "hit on rank 0 only");
    m.negotiator.useCache(false);
    expect(f, m, m.round(m.rank == 0 ? std::vector<Request>{} : std::vector<Request>{req("a")}),
           "0 cached: allreduce a", "cache off, the waiting hit negotiated");
    expect(f, m, m.round({req("a")}), "0 cached: allreduce a", "cache off");
    m.negotiator.useCache(true);
    expect(f, m, m.round({req("a")}), "0 cached: allreduce a", "cache back on, empty");
    expect(f, m, m.round({req("a")}), "1 cached: allreduce a", "cache back on, filled");
  });
}

namespace {

// The message of the Error that fn() throws, or "" when it throws none.
std::string thrown(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("negotiator: the round's bits past the cache's capacity are an error, not a slot") {
  // A peer with a larger cache (or any bad bits) clears a valid bit or sets a hit bit past
  // this rank's capacity: the scan must not hand out that slot.
  for (int64_t capacity : {8, 64, 70}) {
    INFO("capacity " << capacity);
    auto scanned = [&](RoundBits& bits) {
      return thrown([&] { bits.scan(0, [](int) {}, [](int) {}); });
    };
    RoundBits ok(1, capacity);
    ok.clearHits(0);
    ok.set(ok.hit(0, static_cast<int>(capacity - 1)));
    ok.clear(ok.valid(0, 0));
    CHECK(scanned(ok).empty());
    if (capacity % 64 == 0) continue;  // no bit past the capacity in the last word
    RoundBits stale(1, capacity);
    stale.clearHits(0);
    stale.clear(stale.valid(0, static_cast<int>(capacity)));
    CHECK(scanned(stale).find("name response cache slot " + std::to_string(capacity) +
                              ", beyond its capacity " + std::to_string(capacity)) !=
          std::string::npos);
    RoundBits hit(1, capacity);
    hit.clearHits(0);
    hit.set(hit.hit(0, static_cast<int>(capacity) + 1));
    CHECK(scanned(hit).find("TUTTI_CACHE_CAPACITY") != std::string::npos);
  }
}

TEST_CASE("response cache: a slot outside the cache or empty is an error, not an index") {
  ResponseCache cache(8);
  CHECK(thrown([&] { cache.erase(8); }).find("slot 8 is outside the cache of 8") !=
        std::string::npos);
  CHECK_FALSE(thrown([&] { cache.erase(-1); }).empty());
  CHECK_FALSE(thrown([&] { cache.touch(100); }).empty());
  CHECK(thrown([&] { cache.response(3); }).find("slot 3 is empty") != std::string::npos);
  Request q = req("x");
  Response r;
  r.names = {"x"};
  r.counts = {4};
  CHECK(cache.put(q, r) == -1);
  const int slot = cache.lookup(q);
  REQUIRE(slot >= 0);
  CHECK(cache.response(slot).names == r.names);
  CHECK(thrown([&] { cache.erase(slot); }).empty());
}

TEST_CASE("negotiator: a root's response that does not fit the set is an error") {
  Response r;
  r.op = OpType::kAllgather;
  r.names = {"g"};
  r.first_dims = {1, 2};
  CHECK(thrown([&] { checkResponseForSet(r, 2); }).empty());
  CHECK(thrown([&] { checkResponseForSet(r, 3); }) ==
        "malformed response list: allgather 'g': expected one row count per member for a "
        "process set of 3, got 2");
  r.first_dims = {INT64_MAX, 1};
  CHECK(thrown([&] { checkResponseForSet(r, 2); }).find("sum within int64") != std::string::npos);
  r.op = OpType::kAlltoall;
  r.splits = {1, 2, 3};
  CHECK(thrown([&] { checkResponseForSet(r, 2); }).find("expected 4 splits") != std::string::npos);
  r.op = OpType::kBroadcast;
  r.root = 2;
  CHECK(thrown([&] { checkResponseForSet(r, 2); }).find("a root in [0, 2)") != std::string::npos);
  r.type = ResponseType::kError;  // an error carries nothing the executor uses
  CHECK(thrown([&] { checkResponseForSet(r, 2); }).empty());
}

TEST_CASE("negotiator: a malformed request list is an error naming the member it came from") {
  runMembers(2, [](Member& m, Failures& f) {
    if (m.rank == 0) {
      const std::string got = thrown([&] { m.round({req("x")}); });
      if (got.find("process set 0: from rank 1 (a member): malformed request list") ==
          std::string::npos)
        f.add("rank 0: expected the malformed list from rank 1 named, got '" + got + "'");
      return;
    }
    // Rank 1 takes part in the round by hand and sends bytes that are no request list.
    RoundBits bits(1, kCapacity);
    bits.clear(bits.noNew(0));
    m.control->allreduceAnd(bits.words(), deadlineAfter(10));
    m.control->gather("not a request list", deadlineAfter(10));
    try {
      m.control->broadcast("", deadlineAfter(1));  // rank 0 stopped: no answer comes
    } catch (const std::exception&) {
    }
  });
}

namespace {

Request ordered(const std::string& name, std::vector<int64_t> shape = {4},
                OpType op = OpType::kAllreduce) {
  Request q = req(name, std::move(shape));
  q.op = op;
  q.ordered = true;
  return q;
}

// "N ordered, M negotiated:" and the responses, for the ordered path's expectations.
std::string orderedView(const Agreement& a) {
  return std::to_string(a.ordered) + " ordered, " + std::to_string(a.negotiated) +
         " negotiated:" + responses(a);
}

void expectOrdered(Failures& f, const Member& m, const Agreement& a, const std::string& expected,
                   const char* step) {
  expect(f, m, a, expected, step, orderedView);
}

}  // namespace

TEST_CASE("negotiator: ordered ops are agreed by position from the bits alone, in order") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    runMembers(n, [](Member& m, Failures& f) {
      auto a = m.round({ordered("c.0"), ordered("c.1", {3}, OpType::kBroadcast),
                        ordered("c.2", {2, 5}, OpType::kAllgather),
                        ordered("c.3", {6}, OpType::kReducescatter)});
      expectOrdered(f, m, a,
                    "4 ordered, 0 negotiated: allreduce c.0 broadcast c.1 allgather c.2 "
                    "reducescatter c.3",
                    "four ordered ops");
      if (a.negotiation != Clock::duration::zero())
        f.add("rank " + std::to_string(m.rank) + ": a round of ordered ops gathered");
      // The responses are what the coordinator would have agreed: every member's rows.
      if (a.responses.size() == 4 &&
          (a.responses[2].first_dims != std::vector<int64_t>(m.size, 2) ||
           a.responses[0].counts != std::vector<int64_t>{4} ||
           a.responses[3].counts != std::vector<int64_t>{6}))
        f.add("rank " + std::to_string(m.rank) + ": responses differ from the coordinator's");
      // More than a window's worth: the first kOrderedWindow now, the rest next round.
      std::vector<Request> many;
      for (int i = 0; i < RoundBits::kOrderedWindow + 2; ++i)
        many.push_back(ordered("d." + std::to_string(i)));
      auto first = m.round(std::move(many));
      if (first.ordered != static_cast<size_t>(RoundBits::kOrderedWindow))
        f.add("rank " + std::to_string(m.rank) + ": " + std::to_string(first.ordered) +
              " of a full window agreed");
      expectOrdered(f, m, m.round({}), "2 ordered, 0 negotiated: allreduce d.8 allreduce d.9",
                    "the rest of the window");
      expectOrdered(f, m, m.round({}), "0 ordered, 0 negotiated:", "idle");
    });
  }
}

TEST_CASE("negotiator: an ordered op waits until every member holds it") {
  runMembers(3, [](Member& m, Failures& f) {
    // Rank 0 is two ops ahead, rank 1 one: position 0 runs once rank 2 submits it.
    auto ahead = m.round(m.rank == 0   ? std::vector<Request>{ordered("c.0"), ordered("c.1")}
                         : m.rank == 1 ? std::vector<Request>{ordered("c.0")}
                                       : std::vector<Request>{});
    expectOrdered(f, m, ahead, "0 ordered, 0 negotiated:", "rank 2 behind");
    auto caught = m.round(m.rank == 0   ? std::vector<Request>{}
                          : m.rank == 1 ? std::vector<Request>{ordered("c.1")}
                                        : std::vector<Request>{ordered("c.0"), ordered("c.1")});
    expectOrdered(f, m, caught, "2 ordered, 0 negotiated: allreduce c.0 allreduce c.1",
                  "everyone holds both");
  });
}

TEST_CASE("negotiator: ordered ops that differ are negotiated in full, where a mismatch fails "
          "naming both ranks; the positions stay aligned") {
  runMembers(2, [](Member& m, Failures& f) {
    // The same position, another shape on rank 1: nobody runs it by position.
    auto differ = m.round({ordered("c.0", {m.rank == 0 ? 4 : 5}), ordered("c.1")});
    expectOrdered(f, m, differ, "0 ordered, 0 negotiated:", "differing signatures");
    // Position 0 reaches the coordinator from both (an error on both); position 1 runs by
    // position in the same round.
    auto next = m.round({});
    expectOrdered(f, m, next, "1 ordered, 1 negotiated: allreduce c.1 allreduce! c.0",
                  "the mismatch");
    for (const auto& r : next.responses)
      if (r.type == ResponseType::kError &&
          r.error_message.find("rank 0") == std::string::npos)
        f.add("rank " + std::to_string(m.rank) + ": the error names no ranks: " +
              r.error_message);
    expectOrdered(f, m, m.round({ordered("c.2")}), "1 ordered, 0 negotiated: allreduce c.2",
                  "aligned after the mismatch");
  });
}

TEST_CASE("negotiator: ordered ops in another order on each rank are matched by name in full") {
  runMembers(2, [](Member& m, Failures& f) {
    // Position 0 is a on rank 0 and b on rank 1: both go to the coordinator, which matches
    // them by name; no data is combined across names.
    const bool swap = m.rank == 1;
    m.round({ordered(swap ? "b" : "a"), ordered(swap ? "a" : "b")});
    std::string got;
    for (int round = 0; round < 4; ++round) {
      for (const auto& r : m.round({}).responses)
        for (const auto& name : r.names)
          got += std::string(" ") + (r.type == ResponseType::kError ? "!" : "") + name;
    }
    if (got != " a b" && got != " b a")
      f.add("rank " + std::to_string(m.rank) + ": agreed '" + got +
            "', expected a and b once each, neither an error");
  });
}

TEST_CASE("negotiator: an ordered op a member waits for over a second goes to the "
          "coordinator, and the late member's comes there too") {
  runMembers(2, [](Member& m, Failures& f) {
    expectOrdered(f, m, m.round(m.rank == 0 ? std::vector<Request>{ordered("c.0")}
                                            : std::vector<Request>{}),
                  "0 ordered, 0 negotiated:", "rank 1 late");
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    expectOrdered(f, m, m.round({}), "0 ordered, 0 negotiated:", "rank 0 impatient");
    if (m.rank == 0 && !m.negotiator.hasDemoted())
      f.add("rank 0: the waiting ordered op was not sent to full negotiation");
    // Rank 0 sends it in full; rank 1's copy, below the head now, goes there too.
    auto met = m.round(m.rank == 1 ? std::vector<Request>{ordered("c.0")}
                                   : std::vector<Request>{});
    expectOrdered(f, m, met, "0 ordered, 1 negotiated: allreduce c.0", "met at the coordinator");
    expectOrdered(f, m, m.round({ordered("c.1")}), "1 ordered, 0 negotiated: allreduce c.1",
                  "the next by position");
  });
}

TEST_CASE("negotiator: once a member joined, ordered ops are negotiated in full") {
  runMembers(2, [](Member& m, Failures& f) {
    expectOrdered(f, m, m.round({ordered("c.0")}), "1 ordered, 0 negotiated: allreduce c.0",
                  "before the join");
    // Rank 0 joins while rank 1 submits an ordered allreduce: it reaches the coordinator,
    // which counts rank 0 as joined for it.
    auto joined =
        m.round(m.rank == 0 ? std::vector<Request>{join()} : std::vector<Request>{ordered("c.1")});
    expectOrdered(f, m, joined, "0 ordered, 1 negotiated: allreduce c.1", "rank 0 joined");
    auto all = m.round(m.rank == 0 ? std::vector<Request>{} : std::vector<Request>{join()});
    expectOrdered(f, m, all, "0 ordered, 1 negotiated: join join.noname.0", "everyone joined");
    expectOrdered(f, m, m.round({ordered("c.2")}), "0 ordered, 1 negotiated: allreduce c.2",
                  "after a join, in full");
  });
}

TEST_CASE("negotiator: only ungrouped allreduce, broadcast, allgather and reducescatter are "
          "ordered; an allgather whose output cannot fit is not") {
  Negotiator n(0, 0, 4, kCapacity);
  CHECK(n.orderable(ordered("a")));
  CHECK_FALSE(n.orderable(req("a")));
  CHECK_FALSE(n.orderable(ordered("a", {4}, OpType::kAlltoall)));
  CHECK_FALSE(n.orderable(ordered("a", {}, OpType::kBarrier)));
  CHECK_FALSE(n.orderable(ordered("a", {}, OpType::kJoin)));
  Request grouped = ordered("a");
  grouped.group = "a";
  grouped.group_size = 2;
  CHECK_FALSE(n.orderable(grouped));
  CHECK(n.orderable(ordered("g", {3, 2}, OpType::kAllgather)));
  CHECK_FALSE(n.orderable(ordered("g", {}, OpType::kAllgather)));
  CHECK_FALSE(n.orderable(ordered("g", {int64_t(1) << 60}, OpType::kAllgather)));
  // The hash covers every field the response depends on, and the name.
  const uint64_t base = Negotiator::orderedHash(ordered("a"));
  Request other = ordered("a");
  other.prescale = 2.0;
  CHECK(Negotiator::orderedHash(other) != base);
  CHECK(Negotiator::orderedHash(ordered("b")) != base);
  CHECK(Negotiator::orderedHash(ordered("a", {2, 2})) != base);
  CHECK(Negotiator::orderedHash(ordered("a", {4}, OpType::kBroadcast)) != base);
  CHECK(Negotiator::orderedHash(ordered("a")) == base);
}
