// The one place in bench/ that asks which libraries this build has (like registry.cc).
#include "bench/baseline.h"

#if TUTTI_BENCH_WITH_MPI
#include "bench/mpi_baseline.h"
#endif
#if TUTTI_BENCH_WITH_GLOO
#include "bench/gloo_baseline.h"
#endif

namespace tutti {
namespace bench {

namespace {
bool g_mpi_initialized_here = false;
}  // namespace

bool initLaunchMpi() {
#if TUTTI_BENCH_WITH_MPI
  if (mpiLaunched()) g_mpi_initialized_here = initMpiThreadMultiple();
#endif
  return g_mpi_initialized_here;
}

void finalizeLaunchMpi() {
#if TUTTI_BENCH_WITH_MPI
  if (g_mpi_initialized_here) finalizeMpi();
#endif
  g_mpi_initialized_here = false;
}

void abortLaunchMpi(int code) {
#if TUTTI_BENCH_WITH_MPI
  if (mpiLaunched()) abortMpi(code);
#endif
  (void)code;
}

std::unique_ptr<Baseline> makeBaseline(const std::string& backend, std::string* why) {
#if TUTTI_BENCH_WITH_MPI
  if (backend == "mpi") return makeMpiBaseline(why);
#endif
#if TUTTI_BENCH_WITH_GLOO
  if (backend == "gloo") return makeGlooBaseline(why);
#endif
  if (why) *why = "this build has no bare baseline for the '" + backend + "' backend";
  return nullptr;
}

}  // namespace bench
}  // namespace tutti
