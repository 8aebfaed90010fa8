// The one place in bench/ that asks which libraries this build has (like registry.cc).
#include "bench/baseline.h"

#include "bench/error.h"

#include <cstdlib>
#include <cstring>

#include <unistd.h>

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

#if TUTTI_BENCH_WITH_GLOO
void checkOk(const Status& status, const std::string& what) {
  if (!status.ok()) throwError(status.code(), "tutti-bench: " + what + ": " + status.message());
}

// Every rank's bytes in rank order, through Tutti's allgather (lengths first, then bytes).
std::vector<std::string> tuttiExchange(const std::string& bytes) {
  int64_t len = static_cast<int64_t>(bytes.size());
  Handle h = 0;
  TensorView lv;
  lv.data = &len;
  lv.dtype = DataType::kInt64;
  lv.shape = {1};
  Result lens;
  checkOk(allgatherAsync("bench.gloo_rendezvous.lengths", lv, OpOptions(), &h), "allgather");
  checkOk(wait(h, -1.0, &lens), "gloo baseline rendezvous: allgather of lengths");
  std::vector<int64_t> sizes(static_cast<int64_t*>(lens.data),
                             static_cast<int64_t*>(lens.data) + lens.shape[0]);
  std::free(lens.data);
  TensorView bv;
  bv.data = const_cast<char*>(bytes.data());
  bv.dtype = DataType::kUInt8;
  bv.shape = {len};
  Result all;
  checkOk(allgatherAsync("bench.gloo_rendezvous.bytes", bv, OpOptions(), &h), "allgather");
  checkOk(wait(h, -1.0, &all), "gloo baseline rendezvous: allgather of addresses");
  std::vector<std::string> out;
  const char* at = static_cast<const char*>(all.data);
  for (int64_t n : sizes) {
    out.emplace_back(at, static_cast<size_t>(n));
    at += n;
  }
  std::free(all.data);
  return out;
}
#endif

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
  if (backend == "gloo") {
    GlooBaselineConfig config;
    config.rank = tutti::rank();
    config.size = tutti::size();
    const char* iface = std::getenv("TUTTI_GLOO_IFACE");
    if (iface && *iface) config.iface = iface;
    // One host: loopback. Several: this host's name, as gloo resolves it.
    if (tutti::localSize() == tutti::size()) {
      config.hostname = "127.0.0.1";
    } else {
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      config.hostname = host;
    }
    const char* timeout = std::getenv("TUTTI_TIMEOUT_SECONDS");
    if (timeout && std::atof(timeout) > 0) config.timeout_seconds = std::atof(timeout);
    config.exchange = tuttiExchange;
    return makeGlooBaseline(config);
  }
#endif
  if (why) *why = "this build has no bare baseline for the '" + backend + "' backend";
  return nullptr;
}

}  // namespace bench
}  // namespace tutti
