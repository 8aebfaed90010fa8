// Command line of tutti-bench: nccl-tests' flags and meanings, plus Tutti's workloads.
// Parsing is pure (no I/O, no runtime) so that test/bench can check it without processes.
#pragma once

#include <tutti/tutti.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {
namespace bench {

enum class Workload {
  kAllreduce,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kFusion,
  kLatency,
};

// How per-rank times are combined into the reported one (nccl-tests' -a).
enum class TimeCombine : int { kRank0 = 0, kAverage = 1, kMin = 2, kMax = 3 };

// nccl-tests' defaults, except -w (5 per size: nccl-tests warms up once before the sweep).
struct Options {
  Workload workload = Workload::kAllreduce;
  int64_t min_bytes = 32ll << 20;  // -b
  int64_t max_bytes = 32ll << 20;  // -e
  double step_factor = 1.0;        // -f: > 1 multiplies the size each step, else -i is added
  int64_t step_bytes = 1ll << 20;  // -i
  int iters = 20;                  // -n
  int warmup_iters = 5;            // -w
  int agg_iters = 1;               // -m: ops submitted together per iteration (sweeps)
  bool check = true;               // -c
  int run_cycles = 1;              // -N: the whole sweep this many times
  bool report_cputime = false;     // -C: name the time column "cputime" (times are host times)
  int timeout_seconds = 0;         // -T: > 0 sets TUTTI_TIMEOUT_SECONDS for the run
  DataType dtype = DataType::kFloat32;  // -d
  ReduceOp op = ReduceOp::kSum;         // -o
  bool all_dtypes = false;              // -d all: the sweep once per type (dtype ignored)
  bool all_ops = false;                 // -o all: once per reduce op (op ignored)
  int root = 0;                         // -r
  TimeCombine combine = TimeCombine::kAverage;  // -a
  bool baseline = false;                        // --baseline
  std::string baseline_backend;  // --baseline-backend mpi|gloo; empty = Tutti's CPU backend
  std::string json_path;                        // --json
  // fusion: --tensors/--tensor-bytes replace the two default configurations.
  std::vector<std::pair<int, int64_t>> fusion_configs;
  bool help = false;
  // Flags of nccl-tests accepted without their GPU meaning: one "# tutti-bench: ..." line
  // each, printed by rank 0 before the table.
  std::vector<std::string> notices;
  std::vector<std::string> argv;  // the command as given, for the JSON metadata
};

// "8", "1K", "256k", "16M", "1G", "1.5M" (powers of 1024, like nccl-tests; a fraction is
// truncated to whole bytes). Throws Error naming the flag and the text on anything else
// (negative, empty, junk suffix, overflow).
int64_t parseSize(const std::string& text, const std::string& flag);
// nccl-tests names (float, half, bfloat16, double, int32, int8, uint8, int64, ...) and
// Tutti's (float32, float16, bf16, bool, ...).
DataType parseDataType(const std::string& text);
// sum, prod, min, max, avg (nccl-tests) and product, average (Tutti).
ReduceOp parseReduceOp(const std::string& text);
Workload parseWorkload(const std::string& text);

const char* workloadName(Workload workload);
// nccl-tests' names for the table: float, half, bfloat16, double, int32, ...
const char* ncclTypeName(DataType dtype);
const char* ncclOpName(ReduceOp op);  // sum, prod, min, max, avg

// Parses argv[1..] as nccl-tests' getopt_long does: "-b 8", "-b8", "--minbytes 8",
// "--minbytes=8" and unique prefixes of long names ("--min=8"); the workload anywhere.
// Throws Error(kInvalidArgument) with the offending flag and value.
Options parseOptions(int argc, const char* const* argv);
std::string usage();

// What one run of the workload covers: (dtype, op) once, or each of nccl-tests' types
// Tutti has (int8 uint8 int32 int64 half float double bfloat16) for -d all, and each op
// (sum prod max min avg) for -o all where the workload reduces (allreduce, reducescatter),
// in nccl-tests' order. Fusion and latency refuse "all".
std::vector<std::pair<DataType, ReduceOp>> typeOpRuns(const Options& options);

// The sizes swept from min to max: times -f when it is > 1, else plus -i (nccl-tests' rule).
std::vector<int64_t> sweepSizes(const Options& options);

}  // namespace bench
}  // namespace tutti
