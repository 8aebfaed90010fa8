// Who initializes and finalizes MPI. One process per mode (MPI can be initialized once):
//   own:      the transport initializes MPI; MPI stays up after the transport is destroyed
//             (so that a later transport, i.e. tutti_init after tutti_shutdown, works) and
//             is finalized at exit (mpirun fails the test if a rank exits without it).
//   multiple: the program initialized MPI_THREAD_MULTIPLE; the transport uses it and leaves
//             it initialized; the program finalizes.
//   single:   the program initialized MPI_THREAD_SINGLE; the transport refuses, naming both
//             thread levels.
// Exits 0 when every check holds, 1 (with the reasons on stderr) otherwise.
#include "backends/mpi/mpi_transport.h"

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  ++failures;
}

// One allreduce over the world through a fresh transport.
void useTransport(tutti::Transport& transport) {
  std::vector<int> ranks(transport.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  auto backend = transport.makeBackend(ranks, 0);
  int64_t value = transport.rank() + 1;
  backend->allreduce(&value, &value, 1, tutti::DataType::kInt64, tutti::ReduceOp::kSum,
                     tutti::deadlineAfter(60));
  int64_t n = transport.size();
  expect(value == n * (n + 1) / 2, "allreduce gave " + std::to_string(value));
}

bool mpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  tutti::BackendOptions options;
  options.timeout_seconds = 60;
  try {
    if (mode == "own") {
      auto transport = tutti::makeMpiTransport(options);
      int initialized = 0;
      MPI_Initialized(&initialized);
      expect(initialized != 0, "transport did not initialize MPI");
      useTransport(*transport);
      transport.reset();
      expect(!mpiFinalized(), "MPI was finalized before exit");
      transport = tutti::makeMpiTransport(options);  // init after shutdown
      useTransport(*transport);
      transport.reset();
    } else if (mode == "multiple") {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
      auto transport = tutti::makeMpiTransport(options);
      useTransport(*transport);
      transport.reset();
      expect(!mpiFinalized(), "transport finalized MPI that the program initialized");
      MPI_Finalize();
    } else if (mode == "single") {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
      try {
        auto transport = tutti::makeMpiTransport(options);
        expect(false, "transport accepted MPI_THREAD_SINGLE");
      } catch (const tutti::Error& e) {
        std::string message = e.what();
        expect(e.code() == tutti::StatusCode::kBackend, "wrong status code");
        expect(message.find("MPI_THREAD_SINGLE") != std::string::npos &&
                   message.find("needs MPI_THREAD_MULTIPLE") != std::string::npos,
               "message does not name both thread levels: " + message);
      }
      expect(!mpiFinalized(), "a refused transport finalized MPI");
      MPI_Finalize();
    } else {
      std::fprintf(stderr, "usage: %s own|multiple|single\n", argv[0]);
      return 2;
    }
  } catch (const std::exception& e) {
    expect(false, std::string("threw: ") + e.what());
  }
  if (failures == 0) std::printf("mpi init mode %s: all checks passed\n", mode.c_str());
  return failures == 0 ? 0 : 1;
}
