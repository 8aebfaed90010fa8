// The bare baselines of tutti-bench (argv[1]: mpi or gloo) against the bench's own
// references, without Tutti: if either were wrong, --baseline rows and -c 1 would lie.
// Run under mpirun at 1..4 ranks (the gloo one exchanges its addresses over MPI).
// Exit 0 only when every collective, dtype, op and count matched on every rank.
#include "bench/data.h"
#include "bench/mpi_baseline.h"
#include "bench/options.h"
#if TUTTI_BENCH_TEST_GLOO
#include "bench/gloo_baseline.h"
#endif

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <vector>

using namespace tutti;
using namespace tutti::bench;

namespace {

int64_t g_failures = 0;

void expectNoWrong(int64_t wrong, const char* what, DataType dt, ReduceOp op, int64_t count,
                   int rank) {
  if (wrong == 0) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: baseline %s %s %s count %lld: %lld wrong elements\n", rank,
               what, dataTypeName(dt), ncclOpName(op), static_cast<long long>(count),
               static_cast<long long>(wrong));
}

}  // namespace

#if TUTTI_BENCH_TEST_GLOO
std::vector<std::string> mpiExchange(const std::string& bytes) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int len = static_cast<int>(bytes.size());
  std::vector<int> lens(n), displs(n);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::vector<char> all(static_cast<size_t>(total) + 1);
  MPI_Allgatherv(bytes.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.emplace_back(all.data() + displs[r], lens[r]);
  return out;
}
#endif

std::unique_ptr<Baseline> makeNamed(const std::string& which, std::string* why) {
  if (which == "mpi") return makeMpiBaseline(why);
#if TUTTI_BENCH_TEST_GLOO
  if (which == "gloo") {
    GlooBaselineConfig config;
    MPI_Comm_rank(MPI_COMM_WORLD, &config.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &config.size);
    config.hostname = "127.0.0.1";
    config.timeout_seconds = 60;
    config.exchange = mpiExchange;
    return makeGlooBaseline(config);
  }
#endif
  *why = "no baseline named '" + which + "' in this build";
  return nullptr;
}

int main(int argc, char** argv) {
  initMpiThreadMultiple();
  std::string why;
  std::unique_ptr<Baseline> b = makeNamed(argc > 1 ? argv[1] : "mpi", &why);
  if (!b) {
    std::fprintf(stderr, "no baseline: %s\n", why.c_str());
    finalizeMpi();
    return 1;
  }
  const int rank = b->rank(), n = b->size();
  const DataType dtypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt32,
                             DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16,
                             DataType::kFloat32, DataType::kFloat64, DataType::kBool};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  const int64_t counts[] = {0, 1, n - 1, n + 1, 1000, 4099};
  const int64_t cap = 4099 * 8 * n;
  std::vector<char> in(cap), out(cap), exp(cap);
  for (DataType dt : dtypes) {
    const int64_t ts = dataTypeSize(dt);
    for (int64_t count : counts) {
      for (ReduceOp op : ops) {
        if (!b->supports(Workload::kAllreduce, dt, op)) continue;
        // allreduce, out of place and in place
        fillInput(in.data(), count, dt, op, rank, 0);
        std::memset(out.data(), 0, out.size());
        fillReduced(exp.data(), count, dt, op, n, 0);
        b->allreduce(in.data(), out.data(), count, dt, op);
        expectNoWrong(countWrong(out.data(), exp.data(), count, dt), "allreduce", dt, op, count,
                      rank);
        fillInput(out.data(), count, dt, op, rank, 0);
        b->allreduce(out.data(), out.data(), count, dt, op);
        expectNoWrong(countWrong(out.data(), exp.data(), count, dt), "allreduce in place", dt, op,
                      count, rank);
        if (!b->supports(Workload::kReducescatter, dt, op)) continue;
        // reducescatter: count elements per rank
        fillInput(in.data(), count * n, dt, op, rank, 0);
        std::memset(out.data(), 0, out.size());
        fillReduced(exp.data(), count, dt, op, n, rank * count);
        b->reducescatter(in.data(), out.data(), count, dt, op);
        expectNoWrong(countWrong(out.data(), exp.data(), count, dt), "reducescatter", dt, op,
                      count, rank);
      }
      const ReduceOp pattern = ReduceOp::kSum;
      // allgather
      fillInput(in.data(), count, dt, pattern, rank, rank * count);
      std::memset(out.data(), 0, out.size());
      for (int p = 0; p < n; ++p) fillInput(exp.data() + p * count * ts, count, dt, pattern, p, p * count);
      b->allgather(in.data(), out.data(), count, dt);
      expectNoWrong(countWrong(out.data(), exp.data(), count * n, dt), "allgather", dt, pattern,
                    count, rank);
      // alltoall: count elements to each peer
      fillInput(in.data(), count * n, dt, pattern, rank, 0);
      std::memset(out.data(), 0, out.size());
      for (int p = 0; p < n; ++p) fillInput(exp.data() + p * count * ts, count, dt, pattern, p, rank * count);
      b->alltoall(in.data(), out.data(), count, dt);
      expectNoWrong(countWrong(out.data(), exp.data(), count * n, dt), "alltoall", dt, pattern,
                    count, rank);
      // broadcast from every root
      for (int root = 0; root < n; ++root) {
        fillInput(out.data(), count, dt, pattern, rank, 0);
        fillInput(exp.data(), count, dt, pattern, root, 0);
        b->broadcast(out.data(), count, dt, root);
        expectNoWrong(countWrong(out.data(), exp.data(), count, dt), "broadcast", dt, pattern,
                      count, rank);
      }
    }
  }
  b->barrier();
  int64_t total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("bench %s baseline at %d ranks: %lld failures\n", b->name(), n,
                static_cast<long long>(total));
  }
  b.reset();
  finalizeMpi();
  return total == 0 ? 0 : 1;
}
