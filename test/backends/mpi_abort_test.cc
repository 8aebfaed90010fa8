// Large allreduces and the job alarm under mpirun (np 2 and 3), one transport per process:
//   A. rank 0 starts a 16 MiB allreduce (the ring path) that its peers do not join yet; an
//      abort() from another thread 0.5 s later must end it within a second, with the reason
//      (a blocking MPI_Allreduce could not be interrupted: it would wait for the peers).
//   B. the peers start the same allreduce 2 s later with a 60 s deadline: rank 0's abort
//      must reach them through the alarm, failing it within a few seconds with a message
//      naming rank 0 and its reason, and every later op fails at once.
// Rank 0 gathers the verdicts (plain MPI on MPI_COMM_WORLD, which Tutti never poisons) and
// prints "all N ranks passed"; CTest requires that line (after a fatal error the exit may
// be an MPI_Abort by design, see finalizeMpiAtExit).
#include "backends/mpi/mpi_transport.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace tutti;

namespace {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs the allreduce; "" if it failed as expected, else what went wrong.
std::string expectFailure(Backend& backend, std::vector<float>& data, double most_seconds,
                          StatusCode code, const std::vector<std::string>& contains) {
  const auto start = Clock::now();
  try {
    backend.allreduce(data.data(), data.data(), static_cast<int64_t>(data.size()),
                      DataType::kFloat32, ReduceOp::kSum, deadlineAfter(60.0));
  } catch (const Error& e) {
    const double took = secondsSince(start);
    std::string got = std::string(e.what()) + " after " + std::to_string(took) + " s";
    if (e.code() != code) return "wrong code: " + got;
    if (took > most_seconds) return "too slow (most " + std::to_string(most_seconds) + "): " + got;
    for (const auto& text : contains)
      if (got.find(text) == std::string::npos) return "no '" + text + "' in: " + got;
    std::printf("rank %d: failed as expected: %s\n", backend.rank(), got.c_str());
    return "";
  }
  return "the allreduce succeeded after " + std::to_string(secondsSince(start)) + " s";
}

}  // namespace

int main() {
  BackendOptions options;
  options.timeout_seconds = 60;
  auto transport = makeMpiTransport(options);
  const int rank = transport->rank(), size = transport->size();
  std::vector<int> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  auto backend = transport->makeBackend(all, 0);
  std::vector<float> data(4 << 20, 1.0f);  // 16 MiB: the ring path
  backend->allreduce(data.data(), data.data(), static_cast<int64_t>(data.size()),
                     DataType::kFloat32, ReduceOp::kSum, deadlineAfter(60.0));
  std::string verdict = data[12345] == static_cast<float>(size) ? "" : "wrong sum";
  const std::string reason = "test: rank 0 gives up";
  if (verdict.empty() && rank == 0) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      backend->abort(reason);
    });
    verdict = expectFailure(*backend, data, 1.5, StatusCode::kAborted, {reason});
    aborter.join();
  } else if (verdict.empty()) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    verdict = expectFailure(*backend, data, 5.0, StatusCode::kAborted,
                            {"rank 0 failed and stopped the job", reason});
    if (verdict.empty()) verdict = expectFailure(*backend, data, 0.5, StatusCode::kAborted, {reason});
  }
  // Every rank's verdict to rank 0.
  char mine[512] = {};
  std::snprintf(mine, sizeof(mine), "%s", verdict.c_str());
  std::vector<char> verdicts(rank == 0 ? sizeof(mine) * size : 0);
  MPI_Gather(mine, sizeof(mine), MPI_CHAR, verdicts.data(), sizeof(mine), MPI_CHAR, 0,
             MPI_COMM_WORLD);
  if (rank == 0) {
    int failed = 0;
    for (int r = 0; r < size; ++r)
      if (verdicts[r * sizeof(mine)] != '\0') {
        ++failed;
        std::printf("rank %d: FAILED: %s\n", r, &verdicts[r * sizeof(mine)]);
      }
    if (!failed) std::printf("mpi abort test: all %d ranks passed\n", size);
  }
  std::fflush(stdout);
  return 0;
}
