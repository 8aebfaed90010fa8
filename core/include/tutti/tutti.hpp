// Tutti C++ API: the same runtime as tutti.h, with Status objects, shapes, options structs
// and std::function callbacks. Safe to call from any thread; nothing here throws.
#pragma once

#include <tutti/tutti.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

// Exported from libtutti like the C API (see tutti.h): everything declared here.
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

namespace tutti {

enum class DataType : int {
  kUInt8 = TUTTI_UINT8,
  kInt8 = TUTTI_INT8,
  kUInt16 = TUTTI_UINT16,
  kInt16 = TUTTI_INT16,
  kInt32 = TUTTI_INT32,
  kInt64 = TUTTI_INT64,
  kFloat16 = TUTTI_FLOAT16,
  kBFloat16 = TUTTI_BFLOAT16,
  kFloat32 = TUTTI_FLOAT32,
  kFloat64 = TUTTI_FLOAT64,
  kBool = TUTTI_BOOL,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : int {
  kSum = TUTTI_SUM,
  kAverage = TUTTI_AVERAGE,
  kMin = TUTTI_MIN,
  kMax = TUTTI_MAX,
  kProduct = TUTTI_PRODUCT,
};

enum class StatusCode : int {
  kOk = TUTTI_OK,
  kInvalidArgument = TUTTI_ERR_INVALID_ARGUMENT,
  kMismatch = TUTTI_ERR_MISMATCH,
  kTimeout = TUTTI_ERR_TIMEOUT,
  kAborted = TUTTI_ERR_ABORTED,
  kNotInitialized = TUTTI_ERR_NOT_INITIALIZED,
  kBackend = TUTTI_ERR_BACKEND,
  kUnsupported = TUTTI_ERR_UNSUPPORTED,
  kInProgress = TUTTI_ERR_IN_PROGRESS,
  kJoined = TUTTI_ERR_JOINED,
  kDuplicateName = TUTTI_ERR_DUPLICATE_NAME,
  kInternal = TUTTI_ERR_INTERNAL,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  // CUDA ordinal
};

// A non-owning view of a dense, contiguous tensor.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // empty = scalar
  Device device;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using Handle = int64_t;  // 0 is never valid

// Called on the background thread when an op finishes; must not block.
using Callback = std::function<void(Handle, const Status&)>;
// Called on the background thread once an output's shape is known (allgather, alltoall,
// reducescatter). Returns memory for the output: shape's elements of the op's dtype, on
// the input's device. Without one, Tutti mallocs the output and the caller frees it.
using OutputAllocator = std::function<void*(const std::vector<int64_t>& shape)>;

struct OpOptions {
  ReduceOp op = ReduceOp::kSum;  // allreduce, reducescatter
  double prescale = 1.0;         // applied to the input before reducing
  double postscale = 1.0;        // applied to the result (after the 1/size of kAverage)
  int root = 0;                  // broadcast: rank within the process set
  int process_set = TUTTI_GLOBAL_PROCESS_SET;
  std::vector<int64_t> splits;   // alltoall: rows to each rank of the set; empty = equal
  Callback callback;
  OutputAllocator allocator;
};

struct Result {
  void* data = nullptr;  // output of allgather/alltoall/reducescatter
  int64_t nbytes = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> recv_splits;  // alltoall
  int last_joined_rank = -1;         // join
};

Status init();
Status shutdown();
bool isInitialized();
int rank();
int size();
int localRank();
int localSize();
int crossRank();
int crossSize();

Status allreduceAsync(const std::string& name, const TensorView& input, const TensorView& output,
                      const OpOptions& options, Handle* handle);
Status groupedAllreduceAsync(const std::vector<std::string>& names,
                             const std::vector<TensorView>& inputs,
                             const std::vector<TensorView>& outputs, const OpOptions& options,
                             Handle* handle);
Status broadcastAsync(const std::string& name, const TensorView& buffer, const OpOptions& options,
                      Handle* handle);
Status allgatherAsync(const std::string& name, const TensorView& input, const OpOptions& options,
                      Handle* handle);
Status alltoallAsync(const std::string& name, const TensorView& input, const OpOptions& options,
                     Handle* handle);
Status reducescatterAsync(const std::string& name, const TensorView& input,
                          const OpOptions& options, Handle* handle);
Status barrierAsync(int process_set, Handle* handle);
Status joinAsync(int process_set, Handle* handle);

Status poll(Handle handle, bool* done);
// timeout_seconds < 0: wait up to TUTTI_TIMEOUT_SECONDS. kInProgress keeps the handle;
// any other outcome releases it. `result` may be null.
Status wait(Handle handle, double timeout_seconds, Result* result = nullptr);

Status addProcessSet(const std::vector<int>& ranks, int* process_set);
Status removeProcessSet(int process_set);
int processSetRank(int process_set);  // -1 if not a member
int processSetSize(int process_set);  // -1 if unknown
std::vector<int> processSetRanks(int process_set);

// The timeline (docs/troubleshooting.md): `path` a directory ("traces/": every rank writes
// traces/rank-N.json) or a file (rank 0 writes it). Local to this rank; starting again with
// the same path keeps the file, another path stops the first. stopTimeline() completes it.
Status startTimeline(const std::string& path, bool mark_cycles = false);
Status stopTimeline();

// This rank's counters since init, sorted by name (docs/c_api.md, "Counters").
// Empty before init.
std::vector<std::pair<std::string, int64_t>> stats();

// Elastic jobs (docs/elastic.md). isRecoverable: in an elastic job, a failure that leaves
// this process able to go on after shutdown() and init() (which joins the launcher's next
// generation): the job failed under it (a peer died or left, a connection or a deadline
// failed: kAborted, kBackend, kTimeout). Always false outside an elastic job.
bool isRecoverable(const Status& status);
// Whether the launcher has published a newer world than the one this process joined (hosts
// added or removed): then shutdown(), init() and sync the state. kUnsupported outside an
// elastic job.
Status hostsUpdated(bool* updated);
int64_t elasticGeneration();  // the generation this process joined last; -1 if none

bool backendBuilt(const std::string& name);  // "mpi", "gloo", "nccl"
std::string cpuBackend();
const char* dataTypeName(DataType dtype);
int64_t dataTypeSize(DataType dtype);

}  // namespace tutti

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
