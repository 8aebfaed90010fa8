// The workloads of tutti-bench. Each returns the number of wrong elements over all ranks
// (0 when -c 0) and adds its rows to the report.
#pragma once

#include "bench/report.h"
#include "bench/runner.h"

#include <cstdint>

namespace tutti {
namespace bench {

// allreduce, allgather, broadcast, alltoall, reducescatter: nccl-tests' size sweep.
int64_t runSweep(Runner& runner, Report& report);
// T tensors of S bytes per step, against one bare call per tensor and one packed call.
int64_t runFusion(Runner& runner, Report& report);
// One small allreduce at a time: median, p99 and max per size.
int64_t runLatency(Runner& runner, Report& report);

}  // namespace bench
}  // namespace tutti
