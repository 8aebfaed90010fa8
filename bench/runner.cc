#include "bench/runner.h"

#include "bench/error.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace tutti {
namespace bench {

Buffer::Buffer(int64_t bytes) : bytes_(bytes) {
  const size_t rounded = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
  data_ = static_cast<char*>(std::aligned_alloc(4096, rounded ? rounded : 4096));
  if (!data_) {
    throwError(StatusCode::kInternal,
               "tutti-bench: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::memset(data_, 0, rounded ? rounded : 4096);
}

Buffer::~Buffer() { std::free(data_); }

double nowUs() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

TensorView view(void* data, int64_t count, DataType dtype) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = {count};
  return v;
}

const char* timeCombineName(TimeCombine combine) {
  switch (combine) {
    case TimeCombine::kRank0: return "rank 0";
    case TimeCombine::kAverage: return "average";
    case TimeCombine::kMin: return "min";
    case TimeCombine::kMax: return "max";
  }
  return "unknown";
}

Runner::Runner(const Options& options, Baseline* baseline)
    : options_(options), baseline_(baseline), rank_(tutti::rank()), size_(tutti::size()) {}

void Runner::check(const Status& status, const std::string& what) const {
  if (status.ok()) return;
  throwError(status.code(), "tutti-bench: rank " + std::to_string(rank_) + ": " + what + ": " +
                                status.message());
}

void Runner::wait(Handle handle, const std::string& what, Result* result) const {
  check(tutti::wait(handle, -1.0, result), what);
}

void Runner::barrier() const {
  Handle h = 0;
  check(barrierAsync(TUTTI_GLOBAL_PROCESS_SET, &h), "barrier");
  wait(h, "barrier");
}

std::vector<double> Runner::combine(std::vector<double> values) const {
  if (size_ == 1 || values.empty()) return values;
  const int64_t n = static_cast<int64_t>(values.size());
  TensorView v = view(values.data(), n, DataType::kFloat64);
  Handle h = 0;
  OpOptions o;
  if (options_.combine == TimeCombine::kRank0) {
    check(broadcastAsync("bench.combine.rank0", v, o, &h), "broadcast of rank 0's times");
  } else {
    o.op = options_.combine == TimeCombine::kMin   ? ReduceOp::kMin
           : options_.combine == TimeCombine::kMax ? ReduceOp::kMax
                                                   : ReduceOp::kAverage;
    check(allreduceAsync("bench.combine.times", v, v, o, &h), "allreduce of the times");
  }
  wait(h, "combining times over ranks");
  return values;
}

int Runner::settle(double seconds) const {
  // Each op carries "I want more" (1) or "done" (0); max over ranks: all stop together.
  int32_t more = 1;
  int iterations = 0;
  const double start = nowUs();
  TensorView v = view(&more, 1, DataType::kInt32);
  OpOptions o;
  o.op = ReduceOp::kMax;
  while (more != 0) {
    more = nowUs() - start < seconds * 1e6 ? 1 : 0;
    Handle h = 0;
    check(allreduceAsync("bench.settle", v, v, o, &h), "warm-up allreduce");
    wait(h, "warm-up allreduce");
    ++iterations;
  }
  if (baseline_ && baseline_->supports(Workload::kAllreduce, DataType::kInt32, ReduceOp::kMax)) {
    int32_t x = 1;
    for (int i = 0; i < iterations; ++i) {
      baseline_->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kMax);
    }
  }
  barrier();
  return iterations;
}

std::map<std::string, int64_t> Runner::opCalls(const std::string& op) const {
  const std::string prefix = "op." + op + ".", suffix = ".calls";
  std::map<std::string, int64_t> calls;
  for (const auto& stat : tutti::stats()) {
    const std::string& name = stat.first;
    if (name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      calls[name.substr(prefix.size(), name.size() - prefix.size() - suffix.size())] = stat.second;
    }
  }
  return calls;
}

std::string Runner::movedBy(const std::string& op,
                            const std::map<std::string, int64_t>& before) const {
  std::string backends;
  for (const auto& now : opCalls(op)) {
    auto was = before.find(now.first);
    if (now.second > (was == before.end() ? 0 : was->second)) {
      backends += (backends.empty() ? "" : "+") + now.first;
    }
  }
  return backends;
}

std::string Runner::probeAllreduce() const {
  const auto before = opCalls("allreduce");
  Buffer one(8);
  TensorView v = view(one.data(), 1, options_.dtype);
  OpOptions o;
  o.op = options_.op;
  Handle h = 0;
  check(allreduceAsync("bench.probe", v, v, o, &h), "allreduce finding the backend");
  wait(h, "allreduce finding the backend");
  return movedBy("allreduce", before);
}

std::vector<int64_t> Runner::sumOverRanks(std::vector<int64_t> values) const {
  if (size_ == 1 || values.empty()) return values;
  TensorView v = view(values.data(), static_cast<int64_t>(values.size()), DataType::kInt64);
  Handle h = 0;
  check(allreduceAsync("bench.combine.wrong", v, v, OpOptions(), &h),
        "allreduce of the wrong-element counts");
  wait(h, "summing wrong elements over ranks");
  return values;
}

}  // namespace bench
}  // namespace tutti
