// A large allreduce runs as a blocking MPI_Allreduce under a watchdog: when a peer never
// arrives, the watchdog must abort the job at the deadline (naming the op) rather than let
// it hang. Rank 1 stays away for longer than the deadline; CTest checks the message and
// that the job ended (it fails, by design, through MPI_Abort).
#include "backends/mpi/mpi_transport.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

int main() {
  tutti::BackendOptions options;
  options.timeout_seconds = 60;
  auto transport = tutti::makeMpiTransport(options);
  std::vector<int> all(static_cast<size_t>(transport->size()));
  std::iota(all.begin(), all.end(), 0);
  auto backend = transport->makeBackend(all, 0);
  std::vector<float> data(1 << 20, 1.0f);  // 4 MiB: the blocking path
  if (transport->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(20));
    std::printf("rank 1: still alive after 20 s: the watchdog did not abort the job\n");
    return 1;
  }
  backend->allreduce(data.data(), data.data(), static_cast<int64_t>(data.size()),
                     tutti::DataType::kFloat32, tutti::ReduceOp::kSum, tutti::deadlineAfter(1.0));
  std::printf("rank %d: allreduce returned without its peer\n", transport->rank());
  return 1;
}
