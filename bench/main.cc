// tutti-bench: nccl-tests-style tables for Tutti's collectives, with the bare backend timed
// beside them (--baseline). Run under mpirun or tuttirun; see docs/PERFORMANCE.md.
//
// MPI ownership: when Open MPI started this process, tutti-bench initializes MPI itself
// with MPI_THREAD_MULTIPLE before tutti::init (which then keeps MPI as it finds it) and
// finalizes it after tutti::shutdown, so the MPI baseline works on MPI_COMM_WORLD while
// Tutti's background thread uses its own communicators.
#include "bench/baseline.h"
#include "bench/error.h"
#include "bench/options.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/workloads.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace tutti {
namespace bench {
namespace {

constexpr double kSettleSeconds = 0.25;

std::string joinArgs(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

int runBench(const Options& options) {
  if (options.timeout_seconds > 0) {  // -T: the deadline of every wait, Tutti's and the baseline's
    setenv("TUTTI_TIMEOUT_SECONDS", std::to_string(options.timeout_seconds).c_str(), 1);
  }
  initLaunchMpi();
  Status status = tutti::init();
  if (!status.ok()) throwError(status.code(), "tutti-bench: tutti::init: " + status.message());
  const std::string backend = tutti::cpuBackend();
  std::unique_ptr<Baseline> baseline;
  std::string why;
  if (options.baseline) {
    baseline = makeBaseline(
        options.baseline_backend.empty() ? backend : options.baseline_backend, &why);
  }
  const int rank = tutti::rank();

  Metadata meta;
  meta.command = joinArgs(options.argv);
  meta.workload = workloadName(options.workload);
  meta.transport = backend;
  meta.baseline = baseline ? baseline->name() : "";
  meta.ranks = tutti::size();
  meta.dtype = options.all_dtypes ? "all" : ncclTypeName(options.dtype);
  meta.op = options.all_ops ? "all" : ncclOpName(options.op);
  meta.combine = timeCombineName(options.combine);
  meta.iters = options.iters;
  meta.warmup_iters = options.warmup_iters;
  meta.agg_iters = options.agg_iters;
  meta.check = options.check;
  meta.cputime = options.report_cputime;
  fillMachine(&meta);
  if (rank == 0 && options.workload != Workload::kFusion && options.workload != Workload::kLatency)
    meta.memcpy_gbps = measureMemcpy();
  Report report(meta, rank == 0 ? stdout : nullptr);
  if (rank == 0) {
    for (const std::string& notice : options.notices) std::printf("%s\n", notice.c_str());
    if (options.baseline && !baseline) {
      std::printf("# --baseline: no baseline in this run: %s\n", why.c_str());
    }
  }

  // -N cycles of every (dtype, op) that -d/-o ask for (nccl-tests' loop order), all rows in
  // one table.
  int64_t wrong = 0;
  bool settled = false;
  for (int cycle = 0; cycle < options.run_cycles; ++cycle) {
    for (const auto& type_op : typeOpRuns(options)) {
      Options run = options;
      run.dtype = type_op.first;
      run.op = type_op.second;
      Runner runner(run, baseline.get());
      if (!settled) runner.settle(kSettleSeconds);
      settled = true;
      switch (run.workload) {
        case Workload::kFusion: wrong += runFusion(runner, report); break;
        case Workload::kLatency: wrong += runLatency(runner, report); break;
        default: wrong += runSweep(runner, report);
      }
    }
  }
  report.finish(wrong);
  if (rank == 0 && !options.json_path.empty()) report.writeJson(options.json_path);

  baseline.reset();
  status = tutti::shutdown();
  if (!status.ok()) {
    throwError(status.code(), "tutti-bench: tutti::shutdown: " + status.message());
  }
  finalizeLaunchMpi();
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace bench
}  // namespace tutti

int main(int argc, char** argv) {
  using namespace tutti::bench;
  Options options;
  try {
    options = parseOptions(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage().c_str());
    return 2;
  }
  if (options.help) {
    std::printf("%s", usage().c_str());
    return 0;
  }
  try {
    return runBench(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    // The other ranks may be inside a collective with this one: end the job, not just
    // this process, so that nothing waits for a peer that is gone.
    abortLaunchMpi(3);
    return 3;
  }
}
