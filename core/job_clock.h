// One clock for the whole job: every rank's steady clock plus an offset measured at init
// against rank 0's, the way NTP does it, so that timelines of different ranks line up.
#pragma once

#include "backends/backend.h"

#include <cstdint>

namespace tutti {

struct JobClock {
  int64_t offset_us = 0;  // add to this rank's steady clock (µs) to get job time
  int64_t error_us = 0;   // |job time - rank 0's steady clock| is at most this, at init
  int64_t epoch_us = 0;   // rank 0's system clock (µs since the Unix epoch) at job time 0
  int64_t now() const;    // job time, µs
};

// This rank's steady clock in µs.
int64_t steadyMicros();

// Collective over `control` (the global set). Rank 0's steady time at the last exchange is
// job time 0. Each of `rounds` exchanges:
//   1. every rank notes t1 and sends an empty message to rank 0 (gather);
//   2. rank 0, holding every message, notes t3 on its clock and broadcasts it;
//   3. every rank notes t4 when t3 arrives.
// Rank 0 read t3 after this rank sent at t1 and before this rank received at t4, so
// rank 0's clock minus ours lies in [t3 - t4, t3 - t1]: the midpoint is the estimate and
// half the interval its error. The exchange with the narrowest interval wins.
JobClock syncJobClock(ControlPlane& control, Deadline deadline, int rounds = 8);

}  // namespace tutti
