#include "test/conformance/conformance.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace tutti {
namespace test {
namespace {

constexpr uint8_t kGuard = 0xEE;  // written after every output: nothing may touch it

class Suite {
 public:
  Suite(Backend& backend, const ConformanceOptions& options, Failures& failures)
      : b_(backend),
        o_(options),
        f_(failures),
        n_(backend.size()),
        me_(backend.rank()) {}

  void run() {
    for (DataType dtype : allDataTypes()) {
      const auto counts = countsFor(dtype);
      if (b_.supports(OpType::kAllreduce, dtype, DeviceType::kCpu))
        for (ReduceOp op : allReduceOps())
          for (int64_t count : counts)
            for (bool in_place : {false, true}) allreduce(dtype, op, count, in_place);
      if (b_.supports(OpType::kReducescatter, dtype, DeviceType::kCpu))
        for (ReduceOp op : allReduceOps())
          for (int64_t count : counts)
            for (bool in_place : {false, true}) reducescatter(dtype, op, count, in_place);
      if (b_.supports(OpType::kAllgather, dtype, DeviceType::kCpu))
        for (int64_t count : counts)
          for (bool in_place : {false, true}) allgatherv(dtype, count, in_place);
      if (b_.supports(OpType::kBroadcast, dtype, DeviceType::kCpu))
        for (int64_t count : counts)
          checkBroadcastFromEveryRoot(b_, me_, n_, count, dtype, ++salt_, where(count), f_,
                                      deadline());
      if (b_.supports(OpType::kAlltoall, dtype, DeviceType::kCpu))
        for (int64_t count : counts)
          checkAlltoallv(b_, me_, n_, count, dtype, ++salt_, where(count), f_, deadline());
      if (b_.supports(OpType::kBarrier, dtype, DeviceType::kCpu)) b_.barrier(deadline());
    }
  }

 private:
  std::vector<int64_t> countsFor(DataType dtype) const {
    const int64_t k = 16 * n_;
    return {0, 1, k - 1, k, k + 1, o_.large_bytes / dataTypeSize(dtype) + 1};
  }
  Deadline deadline() const { return deadlineAfter(o_.deadline_seconds); }
  std::string where(int64_t count) const {
    return " " + o_.label + " rank " + std::to_string(me_) + " count " + std::to_string(count);
  }
  std::string where(const char* op, int64_t count, bool in_place) const {
    return o_.label + " " + op + " rank " + std::to_string(me_) + " count " +
           std::to_string(count) + (in_place ? " in place" : " out of place") + ":";
  }
  void checkGuard(const std::vector<uint8_t>& buf, int64_t from, const std::string& what) {
    for (size_t i = static_cast<size_t>(from); i < buf.size(); ++i)
      if (buf[i] != kGuard) return f_.add(what + " wrote past the end of its output");
  }

  void allreduce(DataType dtype, ReduceOp op, int64_t count, bool in_place) {
    const int salt = ++salt_;
    const int64_t bytes = count * dataTypeSize(dtype);
    auto in = makeInput(dtype, op, me_, n_, count, salt);
    in.resize(bytes);  // makeInput gives at least one element
    in.resize(bytes + 8, kGuard);
    std::vector<uint8_t> out(bytes + 8, kGuard);
    void* dst = in_place ? in.data() : out.data();
    b_.allreduce(in.data(), dst, count, dtype, op, deadline());
    const std::string what = where("allreduce", count, in_place);
    checkReduced(f_, what, dtype, op, n_, dst, 0, count, salt);
    checkGuard(in_place ? in : out, bytes, what);
    if (!in_place) {
      auto original = makeInput(dtype, op, me_, n_, count, salt);
      if (std::memcmp(original.data(), in.data(), bytes) != 0)
        f_.add(what + " changed its input");
    }
  }

  // Member r's block: (base + r * (salt % 3)) % (base + 2) elements, so some are empty.
  std::vector<int64_t> blocks(int64_t base, int salt) const {
    std::vector<int64_t> counts(n_);
    for (int r = 0; r < n_; ++r) counts[r] = (base + r * (salt % 3 + 1)) % (base + 2);
    return counts;
  }

  void reducescatter(DataType dtype, ReduceOp op, int64_t base, bool in_place) {
    const int salt = ++salt_;
    const int64_t esz = dataTypeSize(dtype);
    const auto counts = blocks(base, salt);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + me_, int64_t{0});
    auto in = makeInput(dtype, op, me_, n_, total, salt);
    in.resize(total * esz);
    in.resize(total * esz + 8, kGuard);
    std::vector<uint8_t> out(counts[me_] * esz + 8, kGuard);
    void* dst = in_place ? in.data() : out.data();
    b_.reducescatter(in.data(), dst, counts, dtype, op, deadline());
    const std::string what = where("reducescatter", base, in_place);
    checkReduced(f_, what, dtype, op, n_, dst, offset, counts[me_], salt);
    if (!in_place) checkGuard(out, counts[me_] * esz, what);
  }

  void allgatherv(DataType dtype, int64_t base, bool in_place) {
    const int salt = ++salt_;
    const int64_t esz = dataTypeSize(dtype);
    const auto counts = blocks(base, salt);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + me_, int64_t{0});
    std::vector<uint8_t> out(total * esz + 8, kGuard), separate(counts[me_] * esz + 1);
    // In place: this member's block already sits at its offset in the output.
    uint8_t* mine = in_place ? out.data() + offset * esz : separate.data();
    for (int64_t i = 0; i < counts[me_] * esz; ++i) mine[i] = patternByte(dtype, me_, i, salt);
    b_.allgatherv(mine, out.data(), counts, dtype, deadline());
    const std::string what = where("allgatherv", base, in_place);
    for (int r = 0, at = 0; r < n_; at += counts[r] * esz, ++r)
      for (int64_t i = 0; i < counts[r] * esz; ++i)
        if (out[at + i] != patternByte(dtype, r, i, salt)) {
          f_.add(what + " " + dataTypeName(dtype) + " block of member " + std::to_string(r) +
                 " wrong at byte " + std::to_string(i));
          break;
        }
    checkGuard(out, total * esz, what);
  }

  Backend& b_;
  const ConformanceOptions& o_;
  Failures& f_;
  const int n_, me_;
  int salt_ = 0;
};

}  // namespace

void runConformance(Backend& backend, const ConformanceOptions& options, Failures& failures) {
  Suite(backend, options, failures).run();
}

int runConformanceProcess(Transport& transport, const ConformanceOptions& options) {
  const int n = transport.size(), me = transport.rank();
  Failures failures;
  try {
    std::vector<int> world(n), mine;
    std::iota(world.begin(), world.end(), 0);
    auto backend = transport.makeBackend(world, 0);
    ConformanceOptions o = options;
    o.label = options.label + " n=" + std::to_string(n);
    runConformance(*backend, o, failures);
    if (n >= 3) {
      for (int r = me % 2; r < n; r += 2) mine.push_back(r);
      auto set = transport.makeBackend(mine, 1 + me % 2);
      o.label = options.label + " n=" + std::to_string(mine.size()) +
                (me % 2 ? " (odd ranks)" : " (even ranks)");
      runConformance(*set, o, failures);
    }
    backend->barrier(deadlineAfter(options.deadline_seconds));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s rank %d: error: %s\n", options.label.c_str(), me, e.what());
    return 2;
  }
  for (const auto& line : failures.list())
    std::fprintf(stderr, "FAILED %s\n", line.c_str());
  std::printf("%s rank %d of %d: %s\n", options.label.c_str(), me, n,
              failures.summary().c_str());
  return failures.list().empty() ? 0 : 1;
}

}  // namespace test
}  // namespace tutti
