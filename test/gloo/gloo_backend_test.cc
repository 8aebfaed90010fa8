// Every gloo op x dtype x reduce op at this world size (run under `tuttirun -np N`), with
// counts 0, 1, odd, n±1 and one >= 16 MiB, in and out of place, on the world and on a
// subgroup; results checked element by element against references computed here.
// Exits non-zero on the first wrong element set (printing up to 20 of them).
#include "backends/gloo/gloo_transport.h"
#include "test/gloo/gloo_test_util.h"

#include <numeric>

using namespace tutti;
using namespace tutti::test;

namespace {

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kProduct};

std::string label(const char* op, DataType dtype, int64_t count, const std::string& extra) {
  return std::string(op) + " " + dataTypeName(dtype) + " count " + std::to_string(count) +
         (extra.empty() ? "" : " " + extra);
}

void testAllreduce(Backend& be, Checker& c, Deadline deadline) {
  const int n = be.size(), me = be.rank();
  std::vector<int64_t> counts = {0, 1, 7, 1023, 1025, 4096 * 3 + 1};
  for (DataType dtype : allDataTypes()) {
    const int64_t es = dataTypeSize(dtype);
    for (ReduceOp op : kOps) {
      for (int64_t count : counts) {
        for (bool in_place : {true, false}) {
          const int salt = static_cast<int>(count % 5);
          std::vector<char> in(count * es + 1), out(count * es + 1, 0x5a);
          for (int64_t i = 0; i < count; ++i) storeValue(in.data(), i, dtype,
                                                         inputValue(me, i, dtype, op, salt));
          void* dst = in_place ? in.data() : out.data();
          be.allreduce(in.data(), dst, count, dtype, op, deadline);
          bool ok = true;
          for (int64_t i = 0; i < count && ok; ++i)
            ok = loadValue(dst, i, dtype) == referenceValue(n, i, dtype, op, salt);
          if (!in_place) ok = ok && out[count * es] == 0x5a;  // nothing written past the end
          c.check(ok, label("allreduce", dtype, count, std::string(reduceOpName(op)) +
                                                          (in_place ? " in place" : "")));
        }
      }
    }
  }
  // >= 16 MiB: float32 sum of 4M + 1 elements.
  const int64_t big = (int64_t{4} << 20) + 1;
  std::vector<float> data(big);
  for (int64_t i = 0; i < big; ++i) data[i] = static_cast<float>((i + me) % 13);
  be.allreduce(data.data(), data.data(), big, DataType::kFloat32, ReduceOp::kSum, deadline);
  bool ok = true;
  for (int64_t i = 0; i < big && ok; ++i) {
    double expect = 0;
    for (int r = 0; r < n; ++r) expect += (i + r) % 13;
    ok = data[i] == static_cast<float>(expect);
  }
  c.check(ok, "allreduce float32 16 MiB + 4 bytes");
}

void testAllgatherv(Backend& be, Checker& c, Deadline deadline) {
  const int n = be.size(), me = be.rank();
  for (DataType dtype : allDataTypes()) {
    const int64_t es = dataTypeSize(dtype);
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<int64_t> counts(n);
      for (int r = 0; r < n; ++r)
        counts[r] = pattern == 0 ? 0 : pattern == 1 ? 1 : pattern == 2 ? (r * 3) % 4 : 1000 + r;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<char> in(counts[me] * es + 1), out(total * es + 1);
      for (int64_t i = 0; i < counts[me]; ++i)
        storeValue(in.data(), i, dtype, inputValue(me, i, dtype, ReduceOp::kSum, 1));
      be.allgatherv(in.data(), out.data(), counts, dtype, deadline);
      bool ok = true;
      int64_t at = 0;
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < counts[r]; ++i, ++at)
          ok = ok && loadValue(out.data(), at, dtype) ==
                         inputValue(r, i, dtype, ReduceOp::kSum, 1);
      c.check(ok, label("allgatherv", dtype, total, "pattern " + std::to_string(pattern)));
    }
  }
  // >= 16 MiB in total, rank r contributing (4M + r) float32s.
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = (int64_t{4} << 20) / n + r;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<int32_t> in(counts[me]), out(total);
  for (int64_t i = 0; i < counts[me]; ++i) in[i] = static_cast<int32_t>(me * 1000003 + i);
  be.allgatherv(in.data(), out.data(), counts, DataType::kInt32, deadline);
  bool ok = true;
  int64_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[r]; ++i, ++at) ok = ok && out[at] == r * 1000003 + i;
  c.check(ok, "allgatherv int32 16 MiB");
}

void testBroadcast(Backend& be, Checker& c, Deadline deadline) {
  const int n = be.size(), me = be.rank();
  for (DataType dtype : allDataTypes()) {
    for (int root = 0; root < n; ++root) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{333}}) {
        std::vector<char> buf(count * dataTypeSize(dtype));
        for (int64_t i = 0; i < count; ++i)
          storeValue(buf.data(), i, dtype, inputValue(me, i, dtype, ReduceOp::kSum, 2));
        be.broadcast(buf.data(), count, dtype, root, deadline);
        bool ok = true;
        for (int64_t i = 0; i < count; ++i)
          ok = ok && loadValue(buf.data(), i, dtype) ==
                         inputValue(root, i, dtype, ReduceOp::kSum, 2);
        c.check(ok, label("broadcast", dtype, count, "root " + std::to_string(root)));
      }
    }
  }
}

void testAlltoallv(Backend& be, Checker& c, Deadline deadline) {
  const int n = be.size(), me = be.rank();
  for (DataType dtype : {DataType::kUInt8, DataType::kFloat16, DataType::kInt32,
                         DataType::kFloat64, DataType::kBool}) {
    for (int k = 0; k < 3; ++k) {
      auto sendCount = [&](int from, int to) -> int64_t {
        return k == 0 ? 0 : (from + 2 * to + k) % 4 * (k == 2 ? 97 : 1);
      };
      std::vector<int64_t> send(n), recv(n);
      for (int j = 0; j < n; ++j) send[j] = sendCount(me, j), recv[j] = sendCount(j, me);
      const int64_t es = dataTypeSize(dtype);
      const int64_t ns = std::accumulate(send.begin(), send.end(), int64_t{0});
      const int64_t nr = std::accumulate(recv.begin(), recv.end(), int64_t{0});
      std::vector<char> in(ns * es + 1), out(nr * es + 1);
      int64_t at = 0;
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < send[j]; ++i)
          storeValue(in.data(), at++, dtype, (me * 3 + j + i) % 5);
      be.alltoallv(in.data(), send, out.data(), recv, dtype, deadline);
      bool ok = true;
      at = 0;
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < recv[j]; ++i) {
          double expect = (j * 3 + me + i) % 5;
          if (dtype == DataType::kBool) expect = expect != 0;
          ok = ok && loadValue(out.data(), at++, dtype) == expect;
        }
      c.check(ok, label("alltoallv", dtype, nr, "pattern " + std::to_string(k)));
    }
  }
}

void testReducescatter(Backend& be, Checker& c, Deadline deadline) {
  const int n = be.size(), me = be.rank();
  for (DataType dtype : allDataTypes()) {
    for (ReduceOp op : kOps) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<int64_t> counts(n);
        for (int r = 0; r < n; ++r)
          counts[r] = pattern == 0 ? 0 : pattern == 1 ? (r + 1) % 3 : 511 + 2 * r;
        const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        const int64_t before = std::accumulate(counts.begin(), counts.begin() + me, int64_t{0});
        const int64_t es = dataTypeSize(dtype);
        std::vector<char> in(total * es + 1), out(counts[me] * es + 1);
        for (int64_t i = 0; i < total; ++i)
          storeValue(in.data(), i, dtype, inputValue(me, i, dtype, op, 3));
        be.reducescatter(in.data(), out.data(), counts, dtype, op, deadline);
        bool ok = true;
        for (int64_t i = 0; i < counts[me]; ++i)
          ok = ok && loadValue(out.data(), i, dtype) ==
                         referenceValue(n, before + i, dtype, op, 3);
        c.check(ok, label("reducescatter", dtype, total,
                          std::string(reduceOpName(op)) + " pattern " +
                              std::to_string(pattern)));
      }
    }
  }
}

void testControlPlane(ControlPlane& cp, Checker& c, Deadline deadline) {
  const int n = cp.size(), me = cp.rank();
  auto payload = [](int r, int round) {
    return std::string(static_cast<size_t>((r * 37 + round * 11) % 13 * (round == 2 ? 5000 : 1)),
                       static_cast<char>('a' + r));
  };
  for (int round = 0; round < 3; ++round) {
    auto got = cp.gather(payload(me, round), deadline);
    bool ok = me == 0 ? static_cast<int>(got.size()) == n : got.empty();
    for (int r = 0; ok && me == 0 && r < n; ++r) ok = got[r] == payload(r, round);
    c.check(ok, "control gather round " + std::to_string(round));
    for (size_t len : {size_t{0}, size_t{1}, size_t{100000}}) {
      std::string mine = me == 0 ? std::string(len, 'z') : "ignored";
      c.check(cp.broadcast(mine, deadline) == std::string(len, 'z'),
              "control broadcast of " + std::to_string(len) + " bytes");
    }
  }
  for (size_t words : {size_t{0}, size_t{1}, size_t{5}}) {
    std::vector<uint64_t> bits(words), expect(words, ~uint64_t{0});
    for (size_t w = 0; w < words; ++w) {
      bits[w] = ~(uint64_t{1} << ((me + w) % 64));
      for (int r = 0; r < n; ++r) expect[w] &= ~(uint64_t{1} << ((r + w) % 64));
    }
    cp.allreduceAnd(bits, deadline);
    c.check(bits == expect, "control allreduceAnd of " + std::to_string(words) + " words");
  }
}

}  // namespace

int main() {
  BackendOptions options = optionsFromEnv();
  const int rank = options.rank, size = options.size;
  Checker c(rank);
  try {
    auto transport = makeGlooTransport(options);
    std::vector<int> world(size);
    std::iota(world.begin(), world.end(), 0);
    auto cp = transport->makeControlPlane(world, 0);
    auto be = transport->makeBackend(world, 0);
    c.check(be->rank() == rank && be->size() == size && cp->rank() == rank,
            "world group ranks");
    const Deadline deadline = deadlineAfter(options.timeout_seconds);
    testControlPlane(*cp, c, deadline);
    testAllreduce(*be, c, deadline);
    testAllgatherv(*be, c, deadline);
    testBroadcast(*be, c, deadline);
    testAlltoallv(*be, c, deadline);
    testReducescatter(*be, c, deadline);
    be->barrier(deadline);

    // Subgroup: the odd world ranks, or {0} in a world of one. Created twice (a process set
    // removed and added again connects afresh).
    std::vector<int> odd;
    for (int r = 1; r < size; r += 2) odd.push_back(r);
    if (odd.empty()) odd.push_back(0);
    const bool member = std::find(odd.begin(), odd.end(), rank) != odd.end();
    for (int round = 0; member && round < 2; ++round) {
      auto sub_cp = transport->makeControlPlane(odd, 5);
      auto sub_be = transport->makeBackend(odd, 5);
      c.check(sub_be->size() == static_cast<int>(odd.size()) &&
                  odd[sub_be->rank()] == rank, "subgroup rank/size");
      testControlPlane(*sub_cp, c, deadline);
      testAllreduce(*sub_be, c, deadline);
      testAlltoallv(*sub_be, c, deadline);
      sub_be->barrier(deadline);
    }
    be->barrier(deadline);
    cp.reset();
    be.reset();
    transport.reset();

    // A second transport in the same process (init after shutdown) connects afresh.
    auto again = makeGlooTransport(options);
    auto be2 = again->makeBackend(world, 0);
    std::vector<int64_t> v(5, rank + 1);
    be2->allreduce(v.data(), v.data(), 5, DataType::kInt64, ReduceOp::kSum, deadline);
    c.check(v == std::vector<int64_t>(5, int64_t{size} * (size + 1) / 2),
            "allreduce on a second transport");
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 2;
  }
  return c.finish("gloo backend");
}
