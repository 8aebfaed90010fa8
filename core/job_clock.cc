#include "core/job_clock.h"

#include <chrono>
#include <limits>
#include <sstream>

namespace tutti {

int64_t steadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t JobClock::now() const { return steadyMicros() + offset_us; }

JobClock syncJobClock(ControlPlane& control, Deadline deadline, int rounds) {
  const bool root = control.rank() == 0;
  int64_t best_theta = 0, best_error = std::numeric_limits<int64_t>::max();
  int64_t last_t3 = 0, last_epoch = 0;
  for (int k = 0; k < rounds; ++k) {
    const int64_t t1 = steadyMicros();
    control.gather(std::string(), deadline);
    std::string stamp;
    if (root) {
      const int64_t t3 = steadyMicros();
      const int64_t sys = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
      stamp = std::to_string(t3) + " " + std::to_string(sys);
    }
    std::istringstream in(control.broadcast(stamp, deadline));
    const int64_t t4 = steadyMicros();
    int64_t t3 = 0;
    in >> t3 >> last_epoch;
    last_t3 = t3;
    const int64_t error = (t4 - t1 + 1) / 2;
    if (error < best_error) {
      best_error = error;
      best_theta = t3 - (t1 + t4) / 2;
    }
  }
  JobClock clock;
  clock.epoch_us = last_epoch;
  if (root) {
    clock.offset_us = -last_t3;  // rank 0's own clock: exact
    clock.error_us = 0;
  } else {
    clock.offset_us = best_theta - last_t3;
    clock.error_us = best_error;
  }
  return clock;
}

}  // namespace tutti
