// The backend conformance suite: the same cases of every collective for every data-plane
// backend (docs/testing.md, "Backend conformance"). A factory per backend makes one
// Backend per member (threads as ranks, or real processes) and calls runConformance on
// every member; the suite asks supports() which (op, dtype) pairs to run, so a backend that
// declines an op is not tested for it (the core gives that op to the next backend).
//
// Cases, in one fixed order on every member (a skipped collective on one member would turn
// a failure into a hang, so checks only record failures):
//   allreduce      every supported dtype x every reduce op x counts x in place / not
//   reducescatter  the same, uneven blocks (some empty), in place (out = start of in) / not
//   allgatherv     every dtype x counts, uneven blocks (some empty), in place / not
//   broadcast      every dtype x counts, from every root
//   alltoallv      every dtype x counts, uneven blocks (some empty)
//   barrier        once per dtype
// counts: 0, 1, k-1, k, k+1 with k = 16 x members (a multiple of the members: ring and
// segment splits leave remainders at k±1), and `large`, which the factory picks above one
// chunk/segment of its backend. References are computed in double from every member's
// input formula (test/backends/backend_test_util.h), never with the reduce kernels.
#pragma once

#include "backends/backend.h"
#include "test/backends/backend_test_util.h"

#include <string>

namespace tutti {
namespace test {

struct ConformanceOptions {
  std::string label;             // "shm n=3", first word of every failure
  int64_t large_bytes = 1 << 20;  // the large count is large_bytes / element size + 1
  double deadline_seconds = 60;  // per collective call
};

// Collective over `backend`'s members: every member calls it with equal options.
// Wrong results go to `failures`; an Error from the backend propagates.
void runConformance(Backend& backend, const ConformanceOptions& options, Failures& failures);

// A factory of real processes (mpi, gloo): collective over `transport`'s world. Runs the
// suite on the world's backend, then, from 3 ranks on, on two process sets at once (the
// even and the odd ranks). Prints one line per failure and a summary; returns the exit
// status: 0, 1 for wrong results, 2 when the backend threw.
int runConformanceProcess(Transport& transport, const ConformanceOptions& options);

}  // namespace test
}  // namespace tutti
