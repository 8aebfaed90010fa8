// The nccl-tests sweep for one collective: for each size, check once per mode against the
// local reference, warm up, then time -n iterations of Tutti and of the bare baseline on
// the same buffers.
#include "bench/workloads.h"

#include "bench/data.h"
#include "bench/error.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace tutti {
namespace bench {
namespace {

// Element counts of one size, with nccl-tests' rounding (multiples of the world size for
// the collectives that split their buffer across ranks).
struct Geometry {
  int64_t send_count = 0;   // elements this rank sends (its input tensor)
  int64_t recv_count = 0;   // elements it receives
  int64_t param_count = 0;  // nccl-tests' count column
  int64_t bytes = 0;        // nccl-tests' size column
};

Geometry geometry(Workload w, int64_t size_bytes, int64_t type_bytes, int n) {
  Geometry g;
  const int64_t count = size_bytes / type_bytes;
  switch (w) {
    case Workload::kAllgather:
      g.send_count = g.param_count = count / n;
      g.recv_count = g.send_count * n;
      break;
    case Workload::kAlltoall:
      g.send_count = g.recv_count = count / n * n;
      g.param_count = count / n;
      break;
    case Workload::kReducescatter:
      g.recv_count = g.param_count = count / n;
      g.send_count = g.recv_count * n;
      break;
    default:
      g.send_count = g.recv_count = g.param_count = count;
  }
  g.bytes = std::max(g.send_count, g.recv_count) * type_bytes;
  return g;
}

bool isReducing(Workload w) { return w == Workload::kAllreduce || w == Workload::kReducescatter; }

class Sweep {
 public:
  Sweep(Runner& runner, Report& report)
      : r_(runner), o_(runner.options()), report_(report), n_(runner.size()),
        ts_(dataTypeSize(o_.dtype)) {
    validate();
    int64_t max_bytes = 0;
    for (int64_t s : sweepSizes(o_)) {
      max_bytes = std::max(max_bytes, geometry(o_.workload, s, ts_, n_).bytes);
    }
    send_ = std::make_unique<Buffer>(max_bytes);
    recv_ = std::make_unique<Buffer>(max_bytes);
    const int64_t kMaxAggregatedBytes = 8ll << 30;
    if (o_.agg_iters > 1 && max_bytes > kMaxAggregatedBytes / o_.agg_iters) {
      throwError(StatusCode::kInvalidArgument,
                 "tutti-bench: -m " + std::to_string(o_.agg_iters) + " with -e " +
                     std::to_string(o_.max_bytes) + ": expected at most 8 GiB of output "
                     "buffers (one of " + std::to_string(max_bytes) + " bytes per op)");
    }
    for (int k = 1; k < o_.agg_iters; ++k) {
      aggregated_.push_back(std::make_unique<Buffer>(max_bytes));
    }
    if (o_.check) expected_ = std::make_unique<Buffer>(max_bytes);
  }

  int64_t run() {
    // The header names the backend that moves the first size (one untimed op).
    const std::vector<int64_t> sizes = sweepSizes(o_);
    g_ = geometry(o_.workload, sizes.front(), ts_, n_);
    const std::string op = workloadName(o_.workload);
    auto before = r_.opCalls(op);
    tuttiOp(o_.workload == Workload::kBroadcast);
    report_.setBackend(r_.movedBy(op, before));
    report_.beginSweep(r_.baseline() != nullptr);
    int64_t total_wrong = 0;
    for (int64_t size : sizes) {
      g_ = geometry(o_.workload, size, ts_, n_);
      before = r_.opCalls(op);
      SweepRow row;
      row.bytes = g_.bytes;
      row.count = g_.param_count;
      row.type = ncclTypeName(o_.dtype);
      row.redop = isReducing(o_.workload) ? ncclOpName(o_.op) : "none";
      row.root = o_.workload == Workload::kBroadcast ? o_.root : -1;
      // Tutti's API: broadcast is in place only; allgather, alltoall and reducescatter
      // write a separate output (from the allocator): out of place only.
      row.out_of_place.present = o_.workload != Workload::kBroadcast;
      row.in_place.present =
          o_.workload == Workload::kAllreduce || o_.workload == Workload::kBroadcast;
      measure(false, &row.out_of_place);
      measure(true, &row.in_place);
      row.backend = r_.movedBy(op, before);
      combine(&row);
      total_wrong += std::max<int64_t>(0, row.out_of_place.wrong) +
                     std::max<int64_t>(0, row.in_place.wrong) +
                     std::max<int64_t>(0, row.out_of_place.base_wrong) +
                     std::max<int64_t>(0, row.in_place.base_wrong);
      report_.addSweepRow(row);
    }
    return total_wrong;
  }

 private:
  void validate() const {
    if (o_.dtype == DataType::kBool && o_.op == ReduceOp::kAverage && isReducing(o_.workload)) {
      throwError(StatusCode::kInvalidArgument,
                 "tutti-bench: -o avg with -d bool: Tutti defines no average on bool");
    }
    if (o_.workload == Workload::kBroadcast && o_.root >= n_) {
      throwError(StatusCode::kInvalidArgument,
                 "tutti-bench: -r " + std::to_string(o_.root) + ": expected a rank below " +
                     std::to_string(n_));
    }
  }

  std::string name(bool in_place) const {
    return std::string("bench.") + workloadName(o_.workload) + "." + ncclTypeName(o_.dtype) +
           "." + ncclOpName(o_.op) + "." + std::to_string(g_.send_count) +
           (in_place ? ".ip" : ".oop");
  }

  // One Tutti op, submitted and waited.
  void tuttiOp(bool in_place) { tuttiOps(in_place, 1); }

  // `count` Tutti ops submitted together, then all waited (-m): the k-th on its own output
  // buffer (recv_ for k = 0), so that no two write the same memory.
  void tuttiOps(bool in_place, int count) {
    std::vector<Handle> handles(static_cast<size_t>(count));
    std::vector<std::string> names(static_cast<size_t>(count));
    for (int k = 0; k < count; ++k) {
      const std::string nm = name(in_place) + (k ? ".m" + std::to_string(k) : "");
      names[k] = nm;
      char* out = k ? aggregated_[k - 1]->data() : recv_->data();
      OpOptions opt;
      opt.op = o_.op;
      opt.root = o_.root;
      opt.allocator = [out](const std::vector<int64_t>&) -> void* { return out; };
      Handle& h = handles[k];
      TensorView in = view(in_place ? out : send_->data(), g_.send_count, o_.dtype);
      switch (o_.workload) {
        case Workload::kAllreduce:
          r_.check(allreduceAsync(nm, in, view(out, g_.recv_count, o_.dtype), opt, &h), nm);
          break;
        case Workload::kBroadcast: r_.check(broadcastAsync(nm, in, opt, &h), nm); break;
        case Workload::kAllgather: r_.check(allgatherAsync(nm, in, opt, &h), nm); break;
        case Workload::kAlltoall: r_.check(alltoallAsync(nm, in, opt, &h), nm); break;
        case Workload::kReducescatter: r_.check(reducescatterAsync(nm, in, opt, &h), nm); break;
        default: throwError(StatusCode::kInternal, "tutti-bench: not a sweep workload");
      }
    }
    for (int k = 0; k < count; ++k) {
      char* out = k ? aggregated_[k - 1]->data() : recv_->data();
      Result result;
      r_.wait(handles[k], names[k], &result);
      if (result.data && result.data != out) {
        std::free(result.data);
        throwError(StatusCode::kInternal, "tutti-bench: rank " + std::to_string(r_.rank()) +
                                              ": " + names[k] +
                                              ": output not in the allocator's buffer");
      }
    }
  }

  void baselineOp(bool in_place) {
    Baseline* b = r_.baseline();
    char* out = recv_->data();
    char* in = in_place ? out : send_->data();
    switch (o_.workload) {
      case Workload::kAllreduce: b->allreduce(in, out, g_.send_count, o_.dtype, o_.op); break;
      case Workload::kBroadcast: b->broadcast(out, g_.send_count, o_.dtype, o_.root); break;
      case Workload::kAllgather: b->allgather(in, out, g_.send_count, o_.dtype); break;
      case Workload::kAlltoall: b->alltoall(in, out, g_.send_count / n_, o_.dtype); break;
      case Workload::kReducescatter:
        b->reducescatter(in, out, g_.recv_count, o_.dtype, o_.op);
        break;
      default: throwError(StatusCode::kInternal, "tutti-bench: not a sweep workload");
    }
  }

  // Fills the input (send buffer, or the receive buffer in place) and the reference.
  void prepareCheck(bool in_place) {
    const int rank = r_.rank();
    const int64_t sc = g_.send_count, rc = g_.recv_count;
    const ReduceOp pattern = isReducing(o_.workload) ? o_.op : ReduceOp::kSum;
    char* in = in_place ? recv_->data() : send_->data();
    if (!in_place) std::memset(recv_->data(), 0, static_cast<size_t>(rc * ts_));
    char* exp = expected_->data();
    switch (o_.workload) {
      case Workload::kAllreduce:
        fillInput(in, sc, o_.dtype, pattern, rank, 0);
        fillReduced(exp, rc, o_.dtype, o_.op, n_, 0);
        break;
      case Workload::kBroadcast:
        fillInput(in, sc, o_.dtype, pattern, rank, 0);
        fillInput(exp, rc, o_.dtype, pattern, o_.root, 0);
        break;
      case Workload::kAllgather:
        fillInput(in, sc, o_.dtype, pattern, rank, rank * sc);
        for (int p = 0; p < n_; ++p) fillInput(exp + p * sc * ts_, sc, o_.dtype, pattern, p, p * sc);
        break;
      case Workload::kAlltoall: {
        // Rank p sends inputValue(p, j*chunk + k) to rank j, so this rank receives
        // inputValue(p, rank*chunk + k) from every p.
        const int64_t chunk = sc / n_;
        fillInput(in, sc, o_.dtype, pattern, rank, 0);
        for (int p = 0; p < n_; ++p) {
          fillInput(exp + p * chunk * ts_, chunk, o_.dtype, pattern, p, rank * chunk);
        }
        break;
      }
      case Workload::kReducescatter:
        fillInput(in, sc, o_.dtype, pattern, rank, 0);
        fillReduced(exp, rc, o_.dtype, o_.op, n_, rank * rc);
        break;
      default: break;
    }
  }

  int64_t wrongNow() const {
    return countWrong(recv_->data(), expected_->data(), g_.recv_count, o_.dtype);
  }

  void measure(bool in_place, ModeResult* m) {
    if (!m->present) return;
    Baseline* b = r_.baseline();
    m->has_baseline = b != nullptr && b->supports(o_.workload, o_.dtype, o_.op);
    if (o_.check) {
      prepareCheck(in_place);
      tuttiOp(in_place);
      m->wrong = wrongNow();
      if (m->has_baseline) {
        prepareCheck(in_place);
        baselineOp(in_place);
        m->base_wrong = wrongNow();
      }
    }
    const int agg = o_.agg_iters;
    for (int i = 0; i < o_.warmup_iters; ++i) tuttiOps(in_place, agg);
    if (m->has_baseline) {
      for (int i = 0; i < o_.warmup_iters; ++i) baselineOp(in_place);
    }
    r_.barrier();
    double t0 = nowUs();
    for (int i = 0; i < o_.iters; ++i) tuttiOps(in_place, agg);
    m->time_us = (nowUs() - t0) / (static_cast<double>(o_.iters) * agg);  // per op, as nccl-tests
    if (m->has_baseline) {
      r_.barrier();
      t0 = nowUs();
      for (int i = 0; i < o_.iters; ++i) baselineOp(in_place);
      m->base_time_us = (nowUs() - t0) / o_.iters;
    }
  }

  void combine(SweepRow* row) const {
    ModeResult* modes[2] = {&row->out_of_place, &row->in_place};
    std::vector<double> times;
    std::vector<int64_t> wrong;
    for (ModeResult* m : modes) {
      times.push_back(m->time_us);
      times.push_back(m->base_time_us);
      wrong.push_back(m->wrong);
      wrong.push_back(m->base_wrong);
    }
    times = r_.combine(times);
    if (o_.check) wrong = r_.sumOverRanks(wrong);
    const double factor = busBandwidthFactor(workloadName(o_.workload), n_);
    const double gb = static_cast<double>(g_.bytes) / 1e9;
    for (int i = 0; i < 2; ++i) {
      ModeResult* m = modes[i];
      m->time_us = times[2 * i];
      m->base_time_us = times[2 * i + 1];
      if (o_.check && m->present) {
        m->wrong = wrong[2 * i];
        m->base_wrong = m->has_baseline ? wrong[2 * i + 1] : -1;
      }
      m->algbw = m->time_us > 0 ? gb / (m->time_us * 1e-6) : 0.0;
      m->busbw = m->algbw * factor;
      const double base_algbw = m->base_time_us > 0 ? gb / (m->base_time_us * 1e-6) : 0.0;
      m->base_busbw = base_algbw * factor;
    }
  }

  Runner& r_;
  const Options& o_;
  Report& report_;
  const int n_;
  const int64_t ts_;
  Geometry g_;
  std::unique_ptr<Buffer> send_, recv_, expected_;
  std::vector<std::unique_ptr<Buffer>> aggregated_;  // -m: outputs of ops 2..m of a group
};

}  // namespace

int64_t runSweep(Runner& runner, Report& report) { return Sweep(runner, report).run(); }

}  // namespace bench
}  // namespace tutti
