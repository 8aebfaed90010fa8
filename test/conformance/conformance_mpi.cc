// The conformance suite (conformance.h) for the MPI backend, one process per rank under
// mpirun. The transport caps one MPI call at 4096 elements, so the large count (64 KiB and
// more) runs every op's chunked path.
#include "backends/mpi/mpi_backend.h"
#include "test/conformance/conformance.h"

int main() {
  using namespace tutti;
  BackendOptions options;
  options.timeout_seconds = 60;
  auto transport = makeMpiTransport(options, 4096);
  test::ConformanceOptions suite;
  suite.label = "mpi";
  suite.large_bytes = 64 << 10;
  return test::runConformanceProcess(*transport, suite);
}
