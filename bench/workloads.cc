// fusion and latency: the workloads beyond one tensor at a time.
#include "bench/workloads.h"

#include "bench/data.h"
#include "bench/error.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace tutti {
namespace bench {
namespace {

// One fusion configuration: T tensors of S bytes, out of place, in one arena each for
// inputs, outputs and the hand-packed baseline buffer.
class FusionCase {
 public:
  FusionCase(Runner& runner, int tensors, int64_t tensor_bytes)
      : r_(runner), o_(runner.options()), tensors_(tensors),
        count_(tensor_bytes / dataTypeSize(o_.dtype)), ts_(dataTypeSize(o_.dtype)),
        in_(tensors * count_ * ts_), out_(tensors * count_ * ts_),
        packed_(tensors * count_ * ts_),
        expected_(o_.check ? tensors * count_ * ts_ : 0) {
    const std::string prefix =
        "fusion." + std::to_string(tensors) + "x" + std::to_string(tensor_bytes) + ".";
    for (int t = 0; t < tensors; ++t) {
      names_.push_back(prefix + std::to_string(t));
      grouped_names_.push_back(prefix + "g" + std::to_string(t));
      inputs_.push_back(view(in_.data() + t * count_ * ts_, count_, o_.dtype));
      outputs_.push_back(view(out_.data() + t * count_ * ts_, count_, o_.dtype));
    }
    fillInput(in_.data(), tensors * count_, o_.dtype, o_.op, r_.rank(), 0);
    if (o_.check) fillReduced(expected_.data(), tensors * count_, o_.dtype, o_.op, r_.size(), 0);
    handles_.resize(static_cast<size_t>(tensors));
  }

  FusionRow run() {
    FusionRow row;
    row.tensors = tensors_;
    row.tensor_bytes = count_ * ts_;
    Baseline* b = r_.baseline();
    row.has_baseline = b != nullptr && b->supports(Workload::kAllreduce, o_.dtype, o_.op);
    std::vector<int64_t> wrong(4, 0);
    if (o_.check) {
      wrong[0] = checked([this] { tuttiStep(); });
      wrong[1] = checked([this] { groupedStep(); });
      if (row.has_baseline) {
        wrong[2] = checked([this] { perTensorStep(); });
        wrong[3] = checked([this] { packedStep(); });
      }
      wrong = r_.sumOverRanks(wrong);
      row.wrong = wrong[0] + wrong[1] + wrong[2] + wrong[3];
    }
    std::vector<double> times = {timed([this] { tuttiStep(); }),
                                 timed([this] { groupedStep(); }), 0.0, 0.0};
    if (row.has_baseline) {
      times[2] = timed([this] { perTensorStep(); });
      times[3] = timed([this] { packedStep(); });
    }
    times = r_.combine(times);
    row.tutti_us = times[0];
    row.tutti_grouped_us = times[1];
    row.per_tensor_us = times[2];
    row.packed_us = times[3];
    return row;
  }

 private:
  // All tensors enqueued, then all handles waited: what a framework does per step.
  void tuttiStep() {
    OpOptions opt;
    opt.op = o_.op;
    for (int t = 0; t < tensors_; ++t) {
      r_.check(allreduceAsync(names_[t], inputs_[t], outputs_[t], opt, &handles_[t]), names_[t]);
    }
    for (int t = 0; t < tensors_; ++t) r_.wait(handles_[t], names_[t]);
  }

  void groupedStep() {
    OpOptions opt;
    opt.op = o_.op;
    Handle h = 0;
    r_.check(groupedAllreduceAsync(grouped_names_, inputs_, outputs_, opt, &h),
             "grouped " + grouped_names_[0]);
    r_.wait(h, "grouped " + grouped_names_[0]);
  }

  void perTensorStep() {
    for (int t = 0; t < tensors_; ++t) {
      r_.baseline()->allreduce(inputs_[t].data, outputs_[t].data, count_, o_.dtype, o_.op);
    }
  }

  // What a user would hand-write: pack, one call in place, unpack.
  void packedStep() {
    const size_t bytes = static_cast<size_t>(count_ * ts_);
    for (int t = 0; t < tensors_; ++t) {
      std::memcpy(packed_.data() + t * bytes, inputs_[t].data, bytes);
    }
    r_.baseline()->allreduce(packed_.data(), packed_.data(), tensors_ * count_, o_.dtype,
                             o_.op);
    for (int t = 0; t < tensors_; ++t) {
      std::memcpy(outputs_[t].data, packed_.data() + t * bytes, bytes);
    }
  }

  template <typename Step>
  int64_t checked(Step step) {
    std::memset(out_.data(), 0, static_cast<size_t>(out_.bytes()));
    step();
    return countWrong(out_.data(), expected_.data(), tensors_ * count_, o_.dtype);
  }

  // Mean step time in us after -w untimed steps.
  template <typename Step>
  double timed(Step step) {
    for (int i = 0; i < o_.warmup_iters; ++i) step();
    r_.barrier();
    const double t0 = nowUs();
    for (int i = 0; i < o_.iters; ++i) step();
    return (nowUs() - t0) / o_.iters;
  }

  Runner& r_;
  const Options& o_;
  const int tensors_;
  const int64_t count_, ts_;
  Buffer in_, out_, packed_, expected_;
  std::vector<std::string> names_, grouped_names_;
  std::vector<TensorView> inputs_, outputs_;
  std::vector<Handle> handles_;
};

}  // namespace

int64_t runFusion(Runner& runner, Report& report) {
  const Options& o = runner.options();
  if (o.dtype == DataType::kBool && o.op == ReduceOp::kAverage) {
    throwError(StatusCode::kInvalidArgument,
               "tutti-bench: -o avg with -d bool: Tutti defines no average on bool");
  }
  report.setBackend(runner.probeAllreduce());
  report.beginFusion(runner.baseline() != nullptr);
  int64_t wrong = 0;
  for (const auto& config : o.fusion_configs) {
    FusionRow row = FusionCase(runner, config.first, config.second).run();
    wrong += std::max<int64_t>(0, row.wrong);
    report.addFusionRow(row);
  }
  return wrong;
}

int64_t runLatency(Runner& runner, Report& report) {
  const Options& o = runner.options();
  if (o.dtype == DataType::kBool && o.op == ReduceOp::kAverage) {
    throwError(StatusCode::kInvalidArgument,
               "tutti-bench: -o avg with -d bool: Tutti defines no average on bool");
  }
  Baseline* b = runner.baseline();
  const bool with_baseline = b != nullptr && b->supports(Workload::kAllreduce, o.dtype, o.op);
  report.setBackend(runner.probeAllreduce());
  report.beginLatency(with_baseline);
  const int64_t ts = dataTypeSize(o.dtype);
  int64_t total_wrong = 0;
  for (int64_t size : sweepSizes(o)) {
    const int64_t count = std::max<int64_t>(1, size / ts);
    Buffer in(count * ts), out(count * ts), expected(count * ts);
    fillInput(in.data(), count, o.dtype, o.op, runner.rank(), 0);
    fillReduced(expected.data(), count, o.dtype, o.op, runner.size(), 0);
    const TensorView vin = view(in.data(), count, o.dtype);
    const TensorView vout = view(out.data(), count, o.dtype);
    const std::string name = "latency." + std::to_string(count);
    OpOptions opt;
    opt.op = o.op;
    auto tuttiOp = [&] {
      Handle h = 0;
      runner.check(allreduceAsync(name, vin, vout, opt, &h), name);
      runner.wait(h, name);
    };
    auto baseOp = [&] { b->allreduce(in.data(), out.data(), count, o.dtype, o.op); };
    std::vector<double> samples(static_cast<size_t>(o.iters));
    auto sample = [&](const std::function<void()>& op) {
      for (int i = 0; i < o.warmup_iters; ++i) op();
      runner.barrier();
      for (double& s : samples) {
        const double t0 = nowUs();
        op();
        s = nowUs() - t0;
      }
      return latencyStats(&samples);
    };
    LatencyRow row;
    row.bytes = count * ts;
    row.has_baseline = with_baseline;
    row.tutti = sample(tuttiOp);
    std::vector<int64_t> wrong = {countWrong(out.data(), expected.data(), count, o.dtype), 0};
    if (with_baseline) {
      std::memset(out.data(), 0, static_cast<size_t>(count * ts));
      row.baseline = sample(baseOp);
      wrong[1] = countWrong(out.data(), expected.data(), count, o.dtype);
    }
    std::vector<double> stats = {row.tutti.median_us,    row.tutti.p99_us,
                                 row.tutti.max_us,       row.baseline.median_us,
                                 row.baseline.p99_us,    row.baseline.max_us};
    stats = runner.combine(stats);
    row.tutti = {stats[0], stats[1], stats[2]};
    row.baseline = {stats[3], stats[4], stats[5]};
    if (o.check) {
      wrong = runner.sumOverRanks(wrong);
      row.wrong = wrong[0] + wrong[1];
      total_wrong += row.wrong;
    }
    report.addLatencyRow(row);
  }
  return total_wrong;
}

}  // namespace bench
}  // namespace tutti
