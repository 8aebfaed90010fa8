// Drives the C API with random arguments: thousands of calls of every op with random dtypes,
// reduce ops, counts (huge, negative, overflowing), shapes, null pointers, names (empty,
// duplicate, huge), splits, roots, process sets, struct_size and timeouts. Every call must
// return a tutti_status_t (never crash, never hang, never an error that means the runtime
// broke), and the job must still reduce correctly at the end.
//
// Every rank draws the same sequence from one seed (TUTTI_FUZZ_SEED, printed by rank 0), so
// the ranks submit the same calls in the same order: a call is accepted or refused alike on
// every member, which keeps the job collective-consistent. Rank-dependent arguments only
// change what cannot change validity: data, allgather's row count, and (on purpose, as a
// mismatch) one rank's dtype. Buffers are real: a count is either within them or beyond
// TUTTI_MAX_TENSOR_BYTES, never in between (that would be a caller lying about its buffer).
// A plain main: each process checks its own results and exits non-zero on a failure.
#include <tutti/tutti.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kBatch = 8;             // ops in flight at once, at most
constexpr int kTensorsPerOp = 4;      // grouped allreduce, at most
constexpr size_t kSlotBytes = 64 * 1024;
constexpr int64_t kMaxElements = 2048;  // elements of a generated shape (before allgather rows)
constexpr int kFirstStatus = TUTTI_OK, kLastStatus = TUTTI_ERR_INTERNAL;

int g_failures = 0;
std::atomic<int> g_callbacks{0};

void fail(const std::string& what) {
  if (++g_failures <= 20) std::fprintf(stderr, "fuzz rank %d: FAILED: %s\n", tutti_rank(), what.c_str());
}

// A status is acceptable when it is a tutti_status_t, and not OK without a reason to be.
void checkStatus(tutti_status_t s, const std::string& call) {
  if (s < kFirstStatus || s > kLastStatus) fail(call + ": status " + std::to_string(s) + " is not a tutti_status_t");
  if (s != TUTTI_OK && std::strlen(tutti_last_error()) == 0) fail(call + ": failed with no last error");
}

void onDone(tutti_handle_t, tutti_status_t, const char*, void*) { g_callbacks.fetch_add(1); }

class Fuzzer {
 public:
  Fuzzer(uint64_t seed, int rank, int size, int subset)
      : rng_(seed), wait_rng_(seed + 1 + static_cast<uint64_t>(rank)), rank_(rank), size_(size), subset_(subset),
        in_(kBatch * kTensorsPerOp, std::vector<unsigned char>(kSlotBytes)),
        out_(kBatch * kTensorsPerOp, std::vector<unsigned char>(kSlotBytes)) {}

  void run(int calls) {
    int done = 0;
    while (done < calls) {
      const int batch = pick(1, kBatch);
      for (int i = 0; i < batch; ++i, ++done) submitOne(i);
      finishBatch();
      last_name_ = batch_name_;
      last_name_used_ = false;
    }
  }

  int accepted() const { return accepted_; }
  int refused() const { return refused_; }

 private:
  struct Pending {
    tutti_handle_t handle;
    std::string call;
    bool result;             // allgather/alltoall/reducescatter: wait_result
    int32_t* check = nullptr;  // int32 sum allreduce: expected n*(n-1)/2 + n*i
    int64_t check_count = 0;
    int tries = 0;
  };

  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool chance(int percent) { return pick(0, 99) < percent; }
  int64_t waitPick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(wait_rng_); }
  bool waitChance(int percent) { return waitPick(0, 99) < percent; }

  // A count that overflows or exceeds the limit, or is negative.
  int64_t badCount() {
    static const int64_t kBad[] = {-1, std::numeric_limits<int64_t>::min(), int64_t(1) << 61,
                                   int64_t(1) << 62, std::numeric_limits<int64_t>::max(),
                                   TUTTI_MAX_TENSOR_BYTES + 1, -(int64_t(1) << 40)};
    return kBad[pick(0, 6)];
  }

  std::string name(int op_index) {
    switch (pick(0, 19)) {
      case 0: return "";                                 // auto-named
      case 1: return std::string(100 * 1024, 'h');       // refused, shortened in the message
      case 2: return std::string(5000, 'l');             // over the 4096-byte limit
      case 3:  // a name the last batch used (done by now), at most once per batch: a second
               // use would find the first in flight or not depending on timing, unlike
               // the other ranks
        if (!last_name_.empty() && !last_name_used_) {
          last_name_used_ = true;
          return last_name_;
        }
        [[fallthrough]];
      default: return "f." + std::to_string(serial_) + "." + std::to_string(op_index);
    }
  }

  // A dtype value, sometimes invalid. C callers may store any int in an enum field (set
  // with setRaw); as a C++ argument only the enum's own range (0..15) is well-defined.
  int rawDtype() {
    if (chance(5)) return chance(50) ? -1 : static_cast<int>(pick(11, 300));
    return static_cast<int>(pick(0, 10));
  }
  tutti_dtype_t dtypeArgument() {
    return static_cast<tutti_dtype_t>(chance(5) ? pick(11, 15) : pick(0, 10));
  }
  template <typename E>
  static void setRaw(E* field, int value) {
    static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
    std::memcpy(field, &value, sizeof value);
  }

  // A shape within kMaxElements, or (sometimes) one with a huge, negative or excess part.
  void shape(tutti_tensor_t* t, bool needs_rows) {
    t->ndim = static_cast<int>(pick(needs_rows ? 1 : 0, 4));
    if (chance(3)) t->ndim = static_cast<int>(chance(50) ? -1 : pick(TUTTI_MAX_DIMS + 1, 64));
    if (chance(5)) t->ndim = TUTTI_MAX_DIMS;
    const int dims = t->ndim < 0 ? 0 : std::min(t->ndim, TUTTI_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < dims; ++i) {
      t->shape[i] = pick(0, 6);
      if (n * std::max<int64_t>(t->shape[i], 1) > kMaxElements) t->shape[i] = 1;
      n *= std::max<int64_t>(t->shape[i], 1);
    }
    if (dims > 0 && chance(5)) t->shape[pick(0, dims - 1)] = badCount();
  }

  int processSet() {
    if (chance(85)) return TUTTI_GLOBAL_PROCESS_SET;
    if (chance(60)) return subset_;
    return static_cast<int>(chance(50) ? -1 : pick(100, 100000));
  }

  void options(tutti_op_options_t* o, int slot) {
    tutti_op_options_init(o);
    setRaw(&o->op, static_cast<int>(chance(5) ? pick(-2, 9) : pick(0, 4)));
    if (chance(10)) o->prescale = 0.5;
    if (chance(10)) o->postscale = 2.0;
    o->process_set = processSet();
    const int set_size = o->process_set == subset_ ? tutti_process_set_size(subset_) : size_;
    o->root = static_cast<int>(chance(90) ? pick(0, std::max(set_size - 1, 0)) : pick(-3, set_size + 3));
    if (chance(10)) o->struct_size = chance(50) ? 0 : (chance(50) ? size_t(1) << 30 : sizeof *o - 1);
    if (chance(15)) o->callback = onDone;
    splits_[slot].assign(static_cast<size_t>(size_) + 2, 0);
    o->splits = nullptr;
    o->nsplits = 0;
    if (chance(30)) {
      o->splits = splits_[slot].data();
      o->nsplits = static_cast<int>(chance(80) ? set_size : pick(-2, set_size + 2));
      if (chance(5)) o->nsplits = INT_MAX;
      if (chance(5)) o->splits = nullptr;
    }
  }

  // Splits of `rows` over the set, sometimes wrong.
  void fillSplits(tutti_op_options_t* o, int64_t rows) {
    if (o->splits == nullptr || o->nsplits <= 0) return;
    int64_t* s = const_cast<int64_t*>(o->splits);
    int64_t left = rows;
    const int n = std::min<int>(o->nsplits, size_ + 2);
    for (int i = 0; i < n; ++i) {
      s[i] = i == n - 1 ? left : pick(0, left);
      left -= s[i];
    }
    if (chance(10)) s[pick(0, n - 1)] = chance(50) ? -1 : badCount();
  }

  void submitOne(int slot) {
    ++serial_;
    const int op = static_cast<int>(pick(0, 8));
    Pending p{};
    tutti_handle_t* hp = chance(2) ? nullptr : &p.handle;
    tutti_status_t s;
    void* in = chance(3) ? nullptr : in_[slot * kTensorsPerOp].data();
    void* out = chance(3) ? nullptr : out_[slot * kTensorsPerOp].data();
    const std::string nm = name(slot);
    tutti_op_options_t o;
    options(&o, slot);
    tutti_op_options_t* op_options = chance(10) ? nullptr : &o;
    tutti_tensor_t t{};
    t.data = in;
    int tdtype = rawDtype();
    // A mismatch on purpose: rank 1 sends another valid, non-bool dtype (valid wherever the
    // others' is, so the op is accepted or refused alike on every rank).
    const bool swap = chance(3);
    if (swap && size_ > 1 && rank_ == 1 && tdtype >= 0 && tdtype < TUTTI_BOOL)
      tdtype = tdtype == TUTTI_INT8 ? TUTTI_UINT8 : TUTTI_INT8;
    setRaw(&t.dtype, tdtype);
    switch (op) {
      case 0: {  // flat allreduce, the int32 sums checked afterwards
        int64_t count = chance(8) ? badCount() : pick(0, kMaxElements);
        tutti_dtype_t d = chance(50) ? TUTTI_INT32 : dtypeArgument();
        tutti_reduce_op_t r = chance(70) ? TUTTI_SUM : static_cast<tutti_reduce_op_t>(pick(0, 7));
        if (in && d == TUTTI_INT32) {
          auto* x = static_cast<int32_t*>(in);
          for (int64_t i = 0; i < std::min<int64_t>(count, kMaxElements); ++i) x[i] = rank_ + static_cast<int32_t>(i);
        }
        p.call = "allreduce_async '" + nm.substr(0, 32) + "' count " + std::to_string(count);
        s = tutti_allreduce_async(nm.c_str(), in, out, count, d, r, 1.0, 1.0, hp);
        if (s == TUTTI_OK && d == TUTTI_INT32 && r == TUTTI_SUM) {
          p.check = static_cast<int32_t*>(out);
          p.check_count = count;
        }
        break;
      }
      case 1: {
        int64_t count = chance(8) ? badCount() : pick(0, kMaxElements);
        int root = static_cast<int>(chance(90) ? pick(0, size_ - 1) : pick(-3, size_ + 3));
        p.call = "broadcast_async count " + std::to_string(count) + " root " + std::to_string(root);
        s = tutti_broadcast_async(chance(3) ? nullptr : nm.c_str(), out, count, dtypeArgument(), root, hp);
        break;
      }
      case 2: {
        shape(&t, false);
        tutti_tensor_t o_t = t;
        o_t.data = out;
        p.call = "allreduce_tensor_async ndim " + std::to_string(t.ndim);
        s = tutti_allreduce_tensor_async(nm.c_str(), chance(2) ? nullptr : &t, &o_t, op_options, hp);
        break;
      }
      case 3: {
        shape(&t, false);
        t.data = out;
        p.call = "broadcast_tensor_async ndim " + std::to_string(t.ndim);
        s = tutti_broadcast_tensor_async(nm.c_str(), &t, op_options, hp);
        break;
      }
      case 4: case 5: case 6: {
        shape(&t, true);
        // Uneven rows per rank, only where the buffer is real (null is valid for no rows).
        if (op == 4 && t.data && t.ndim > 0 && t.shape[0] >= 0 && t.shape[0] < 16) t.shape[0] += rank_ % 3;
        if (op == 5 && t.ndim > 0) fillSplits(&o, t.shape[0]);
        p.result = true;
        p.call = std::string(op == 4 ? "allgather" : op == 5 ? "alltoall" : "reducescatter") +
                 "_async ndim " + std::to_string(t.ndim);
        const tutti_tensor_t* arg = chance(2) ? nullptr : &t;
        s = op == 4 ? tutti_allgather_async(nm.c_str(), arg, op_options, hp)
            : op == 5 ? tutti_alltoall_async(nm.c_str(), arg, op_options, hp)
                      : tutti_reducescatter_async(nm.c_str(), arg, op_options, hp);
        break;
      }
      case 7: {  // grouped allreduce
        const int n = static_cast<int>(pick(-1, kTensorsPerOp));
        std::vector<std::string> names;
        std::vector<const char*> cnames;
        std::vector<tutti_tensor_t> ins, outs;
        for (int i = 0; i < std::max(n, 0); ++i) {
          names.push_back(chance(5) ? std::string() : nm + ".g" + std::to_string(chance(5) ? 0 : i));
          tutti_tensor_t x = t;
          shape(&x, false);
          x.data = in_[slot * kTensorsPerOp + i].data();
          ins.push_back(x);
          x.data = out_[slot * kTensorsPerOp + i].data();
          outs.push_back(x);
        }
        for (auto& m : names) cnames.push_back(m.c_str());
        p.call = "grouped_allreduce_async n " + std::to_string(n);
        s = tutti_grouped_allreduce_async(chance(3) ? nullptr : cnames.data(), ins.data(), outs.data(), n,
                                          op_options, hp);
        break;
      }
      default: {  // blocking: barrier on a random set
        const int set = processSet();
        p.call = "barrier set " + std::to_string(set);
        s = tutti_barrier(set, chance(50) ? 60.0 : -1.0);
        checkStatus(s, p.call);
        if (s != TUTTI_OK && s != TUTTI_ERR_INVALID_ARGUMENT) fail(p.call + ": " + tutti_last_error());
        return;
      }
    }
    checkStatus(s, p.call);
    // Reused only once this batch is over: whether a name is still in flight when reused
    // within a batch depends on timing, and would differ between ranks (grouped ops refuse
    // duplicates within one call instead). Whatever the outcome here, so all ranks agree.
    batch_name_ = nm;
    if (std::getenv("TUTTI_FUZZ_TRACE"))  // to compare the ranks' sequences
      std::fprintf(stderr, "fuzz rank %d call %lld %s: %s %s\n", rank_, static_cast<long long>(serial_),
                   p.call.c_str(), tutti_status_string(s), s ? tutti_last_error() : "");
    if (s == TUTTI_OK && hp == nullptr) fail(p.call + ": accepted a null handle pointer");
    if (s != TUTTI_OK) {
      ++refused_;
      if (s != TUTTI_ERR_INVALID_ARGUMENT && s != TUTTI_ERR_DUPLICATE_NAME)
        fail(p.call + ": refused with " + tutti_status_string(s) + ": " + tutti_last_error());
      return;
    }
    ++accepted_;
    pending_.push_back(p);
  }

  // Waits for every accepted op, in random order and with random ways and timeouts.
  void finishBatch() {
    while (!pending_.empty()) {
      const size_t i = static_cast<size_t>(waitPick(0, static_cast<int64_t>(pending_.size()) - 1));
      Pending p = pending_[i];
      const double timeouts[] = {0.0, 0.0005, 60.0, -1.0, std::nan(""), -1e300, 1e300};
      // Short timeouts leave the handle in flight; after 20 tries wait for real (bounded).
      const double timeout = ++pending_[i].tries > 20 ? 60.0 : timeouts[waitPick(0, 6)];
      tutti_status_t s;
      if (waitChance(10)) {
        int done = 0;
        checkStatus(tutti_poll(p.handle, waitChance(10) ? nullptr : &done), p.call + " poll");
      }
      if (p.result || waitChance(20)) {
        tutti_result_t r{};
        r.struct_size = waitChance(5) ? 0 : sizeof r;
        s = tutti_wait_result(p.handle, timeout, waitChance(3) ? nullptr : &r);
        if (s == TUTTI_OK || (s != TUTTI_ERR_IN_PROGRESS && s != TUTTI_ERR_INVALID_ARGUMENT)) {
          tutti_free(r.data);
          tutti_free(r.recv_splits);
          if (s == TUTTI_OK && (r.ndim < 0 || r.ndim > TUTTI_MAX_DIMS)) fail(p.call + ": result ndim " + std::to_string(r.ndim));
        }
      } else {
        s = tutti_wait(p.handle, timeout);
      }
      checkStatus(s, p.call + " wait");
      // IN_PROGRESS (short timeout) and INVALID_ARGUMENT (a bad wait argument) keep the handle.
      if (s == TUTTI_ERR_IN_PROGRESS || (s == TUTTI_ERR_INVALID_ARGUMENT && std::strstr(tutti_last_error(), "wait") != nullptr))
        continue;
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      if (s != TUTTI_OK && s != TUTTI_ERR_MISMATCH && s != TUTTI_ERR_INVALID_ARGUMENT &&
          s != TUTTI_ERR_UNSUPPORTED)
        fail(p.call + ": finished with " + tutti_status_string(s) + ": " + tutti_last_error());
      if (s == TUTTI_OK && p.check) {
        for (int64_t k = 0; k < p.check_count; ++k) {
          const int64_t want = int64_t(size_) * (size_ - 1) / 2 + int64_t(size_) * k;
          if (p.check[k] != want) {
            fail(p.call + ": element " + std::to_string(k) + " is " + std::to_string(p.check[k]) +
                 ", expected " + std::to_string(want));
            break;
          }
        }
      }
    }
  }

  // rng_ draws the calls: the same on every rank, so its draws must never depend on timing.
  // wait_rng_ draws how this rank waits, whose outcome (in progress or done) is timing.
  std::mt19937_64 rng_, wait_rng_;
  const int rank_, size_, subset_;
  std::vector<std::vector<unsigned char>> in_, out_;
  std::vector<int64_t> splits_[kBatch];
  std::vector<Pending> pending_;
  std::string last_name_, batch_name_;
  bool last_name_used_ = false;
  int64_t serial_ = 0;
  int accepted_ = 0, refused_ = 0;
};

int envInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<int>(std::strtoll(v, nullptr, 10)) : static_cast<int>(fallback);
}

}  // namespace

int main() {
  const uint64_t seed = static_cast<uint64_t>(envInt("TUTTI_FUZZ_SEED", 20261201));
  const int calls = envInt("TUTTI_FUZZ_CALLS", 3000);
  // Before init every call is refused, never a crash.
  tutti_handle_t h = 0;
  float x[2] = {1, 2};
  checkStatus(tutti_allreduce_async("pre", x, x, 2, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h), "before init");
  if (tutti_allreduce_async("pre", x, x, 2, TUTTI_FLOAT32, TUTTI_SUM, 1, 1, &h) != TUTTI_ERR_NOT_INITIALIZED)
    fail("allreduce before init is not TUTTI_ERR_NOT_INITIALIZED");
  if (tutti_init() != TUTTI_OK) {
    std::fprintf(stderr, "fuzz: tutti_init failed: %s\n", tutti_last_error());
    return 1;
  }
  const int rank = tutti_rank(), size = tutti_size();
  if (rank == 0)
    std::printf("fuzz: seed %llu (TUTTI_FUZZ_SEED), %d calls (TUTTI_FUZZ_CALLS), %d rank(s)\n",
                static_cast<unsigned long long>(seed), calls, size);
  std::vector<int> evens;
  for (int r = 0; r < size; r += 2) evens.push_back(r);
  int subset = -1;
  if (tutti_add_process_set(evens.data(), static_cast<int>(evens.size()), &subset) != TUTTI_OK) {
    std::fprintf(stderr, "fuzz: add_process_set failed: %s\n", tutti_last_error());
    return 1;
  }
  Fuzzer fuzzer(seed, rank, size, subset);
  fuzzer.run(calls);
  if (fuzzer.accepted() < calls / 10 || fuzzer.refused() < calls / 10)
    fail("the mix is off: " + std::to_string(fuzzer.accepted()) + " accepted, " +
         std::to_string(fuzzer.refused()) + " refused");
  // The job still works: one checked allreduce, then shutdown, then refusals again.
  int32_t v[4] = {rank, rank, rank, rank};
  if (tutti_allreduce_async("final", v, v, 4, TUTTI_INT32, TUTTI_SUM, 1, 1, &h) != TUTTI_OK ||
      tutti_wait(h, 60) != TUTTI_OK || v[3] != size * (size - 1) / 2)
    fail(std::string("the final allreduce: ") + tutti_last_error());
  tutti_shutdown();
  if (tutti_wait(h, 1) != TUTTI_ERR_NOT_INITIALIZED) fail("wait after shutdown is not TUTTI_ERR_NOT_INITIALIZED");
  std::printf("fuzz rank %d: %d accepted, %d refused, %d callbacks, %d failure(s)\n", rank,
              fuzzer.accepted(), fuzzer.refused(), g_callbacks.load(), g_failures);
  return g_failures == 0 ? 0 : 1;
}
