#include "bench/mpi_baseline.h"

#include "bench/elements.h"
#include "bench/error.h"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <string>

namespace tutti {
namespace bench {
namespace {

// MPI has no 16-bit float types: they travel as 2-byte contiguous types reduced by user
// ops over the bench's own (bench/elements.h). MPI user functions cannot carry state, so the two type handles
// live here for the lifetime of MPI (set once by the first MpiBaseline).
MPI_Datatype g_half_type = MPI_DATATYPE_NULL;
MPI_Datatype g_bf16_type = MPI_DATATYPE_NULL;

template <ReduceOp kOp>
void halfReduce(void* in, void* inout, int* len, MPI_Datatype* type) {
  const DataType dtype = *type == g_half_type ? DataType::kFloat16 : DataType::kBFloat16;
  reduceInto(inout, in, *len, dtype, kOp);
}

void checkMpi(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throwError(StatusCode::kBackend, std::string("tutti-bench: rank ") + std::to_string(rank) +
                                       ": baseline " + call + " failed: " +
                                       std::string(text, static_cast<size_t>(len)));
}

int mpiCount(int64_t count, const char* call) {
  if (count < 0 || count > INT_MAX) {
    throwError(StatusCode::kInvalidArgument, std::string("tutti-bench: baseline ") + call +
                                                 ": " + std::to_string(count) +
                                                 " elements exceed MPI's int count");
  }
  return static_cast<int>(count);
}

class MpiBaseline : public Baseline {
 public:
  MpiBaseline() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (g_half_type == MPI_DATATYPE_NULL) {
      MPI_Type_contiguous(2, MPI_BYTE, &g_half_type);
      MPI_Type_commit(&g_half_type);
      MPI_Type_contiguous(2, MPI_BYTE, &g_bf16_type);
      MPI_Type_commit(&g_bf16_type);
    }
    MPI_Op_create(&halfReduce<ReduceOp::kSum>, 1, &half_ops_[0]);
    MPI_Op_create(&halfReduce<ReduceOp::kMin>, 1, &half_ops_[1]);
    MPI_Op_create(&halfReduce<ReduceOp::kMax>, 1, &half_ops_[2]);
    MPI_Op_create(&halfReduce<ReduceOp::kProduct>, 1, &half_ops_[3]);
  }
  ~MpiBaseline() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(Workload, DataType dtype, ReduceOp op) const override {
    return !(dtype == DataType::kBool && op == ReduceOp::kAverage);
  }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype,
                 ReduceOp op) override {
    const void* send = in == out ? MPI_IN_PLACE : in;
    checkMpi(MPI_Allreduce(send, out, mpiCount(count, "MPI_Allreduce"), type(dtype),
                           mpiOp(dtype, op), MPI_COMM_WORLD),
             "MPI_Allreduce", rank_);
    if (op == ReduceOp::kAverage) scaleInPlace(out, count, dtype, 1.0 / size_);
  }

  void allgather(const void* in, void* out, int64_t count, DataType dtype) override {
    const int n = mpiCount(count, "MPI_Allgather");
    checkMpi(MPI_Allgather(in, n, type(dtype), out, n, type(dtype), MPI_COMM_WORLD),
             "MPI_Allgather", rank_);
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root) override {
    checkMpi(MPI_Bcast(buf, mpiCount(count, "MPI_Bcast"), type(dtype), root, MPI_COMM_WORLD),
             "MPI_Bcast", rank_);
  }

  void alltoall(const void* in, void* out, int64_t count, DataType dtype) override {
    const int n = mpiCount(count, "MPI_Alltoall");
    checkMpi(MPI_Alltoall(in, n, type(dtype), out, n, type(dtype), MPI_COMM_WORLD),
             "MPI_Alltoall", rank_);
  }

  void reducescatter(const void* in, void* out, int64_t count, DataType dtype,
                     ReduceOp op) override {
    checkMpi(MPI_Reduce_scatter_block(in, out, mpiCount(count, "MPI_Reduce_scatter_block"),
                                      type(dtype), mpiOp(dtype, op), MPI_COMM_WORLD),
             "MPI_Reduce_scatter_block", rank_);
    if (op == ReduceOp::kAverage) scaleInPlace(out, count, dtype, 1.0 / size_);
  }

  void barrier() override { checkMpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", rank_); }

 private:
  static MPI_Datatype type(DataType dtype) {
    switch (dtype) {
      case DataType::kUInt8: return MPI_UINT8_T;
      case DataType::kInt8: return MPI_INT8_T;
      case DataType::kUInt16: return MPI_UINT16_T;
      case DataType::kInt16: return MPI_INT16_T;
      case DataType::kInt32: return MPI_INT32_T;
      case DataType::kInt64: return MPI_INT64_T;
      case DataType::kFloat16: return g_half_type;
      case DataType::kBFloat16: return g_bf16_type;
      case DataType::kFloat32: return MPI_FLOAT;
      case DataType::kFloat64: return MPI_DOUBLE;
      case DataType::kBool: return MPI_C_BOOL;
    }
    return MPI_DATATYPE_NULL;
  }

  MPI_Op mpiOp(DataType dtype, ReduceOp op) const {
    if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage: return half_ops_[0];
        case ReduceOp::kMin: return half_ops_[1];
        case ReduceOp::kMax: return half_ops_[2];
        case ReduceOp::kProduct: return half_ops_[3];
      }
    }
    if (dtype == DataType::kBool) {
      return op == ReduceOp::kSum || op == ReduceOp::kMax ? MPI_LOR : MPI_LAND;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: return MPI_SUM;
      case ReduceOp::kMin: return MPI_MIN;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kProduct: return MPI_PROD;
    }
    return MPI_OP_NULL;
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Op half_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace

bool mpiLaunched() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

bool initMpiThreadMultiple() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return false;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throwError(StatusCode::kBackend,
               "tutti-bench: MPI_Init_thread gave thread level " + std::to_string(provided) +
                   ", expected MPI_THREAD_MULTIPLE (Tutti's background thread and the "
                   "baseline both call MPI)");
  }
  return true;
}

void finalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_half_type != MPI_DATATYPE_NULL) {
    MPI_Type_free(&g_half_type);
    MPI_Type_free(&g_bf16_type);
  }
  MPI_Finalize();
}

void abortMpi(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Baseline> makeMpiBaseline(std::string* why) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    if (why) *why = "MPI is not initialized (run under mpirun)";
    return nullptr;
  }
  return std::make_unique<MpiBaseline>();
}

}  // namespace bench
}  // namespace tutti
