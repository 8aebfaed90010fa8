// MPI data plane and control plane: every op is a non-blocking MPI collective on the
// group's own communicator, waited for with a deadline (waitRequest). Ops larger than one
// MPI call can carry (int counts and displacements) are split into chunks.
#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

namespace tutti {
namespace detail {
namespace {

const uint8_t* at(const void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<const uint8_t*>(base) + elements * element_bytes;
}
uint8_t* at(void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<uint8_t*>(base) + elements * element_bytes;
}
bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
// MPI wants non-null buffers even for zero counts in some code paths.
uint8_t kEmpty[8];
const void* orEmpty(const void* p) { return p ? p : kEmpty; }
void* orEmpty(void* p) { return p ? p : kEmpty; }

// Owns the group's communicator; shared by the control plane and the backend classes.
class MpiMember {
 public:
  explicit MpiMember(MpiGroupInfo info) : info_(std::move(info)) {
    where_.world_rank = info_.world_rank;
    where_.id = info_.id;
    where_.ranks = &info_.ranks;
    checkMpi(MPI_Comm_rank(info_.comm, &rank_), "MPI_Comm_rank", where_("setup"));
    checkMpi(MPI_Comm_size(info_.comm, &size_), "MPI_Comm_size", where_("setup"));
  }
  ~MpiMember() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A poisoned communicator may still carry an abandoned request: leave it alone.
    if (!finalized && !info_.poison->poisoned() && info_.comm != MPI_COMM_NULL)
      MPI_Comm_free(&info_.comm);
  }
  MpiMember(const MpiMember&) = delete;
  MpiMember& operator=(const MpiMember&) = delete;

 protected:
  // Starts an op: fails fast if poisoned, returns its name for messages.
  std::string begin(const char* op) const {
    info_.poison->throwIfPoisoned();
    return where_(op);
  }
  // A failed MPI call poisons the group (its state is unknown) and throws.
  void check(int rc, const char* call, const std::string& what) {
    if (rc == MPI_SUCCESS) return;
    try {
      checkMpi(rc, call, what);
    } catch (const Error& e) {
      info_.poison->poison(e.code(), e.what());
      throw;
    }
  }
  void wait(MPI_Request& request, Deadline deadline, Clock::time_point start,
            const std::string& what) {
    waitRequest(request, deadline, start, what, *info_.poison, *info_.shared);
  }
  int count(int64_t n, const std::string& what) const {
    return checkedCount(n, info_.shared->maxMessageElements(), what);
  }

  MpiGroupInfo info_;
  MpiWhere where_;
  int rank_ = 0, size_ = 1;
};

// From this size on, allreduce uses the blocking MPI_Allreduce under a watchdog: Open MPI's
// tuned blocking algorithms beat its non-blocking (libnbc) ones by up to 2x here, while
// small ones keep the non-blocking path, whose waits can be interrupted by abort().
constexpr int64_t kBlockingAllreduceBytes = 64 << 10;

class MpiBackend : public Backend, private MpiMember {
 public:
  using MpiMember::MpiMember;
  const char* name() const override { return "mpi"; }
  const char* algorithm(OpType op, int64_t bytes) const override {
    switch (op) {  // Open MPI's coll component picks the algorithm inside each call
      case OpType::kAllreduce:
        return bytes >= kBlockingAllreduceBytes ? "MPI_Allreduce" : "MPI_Iallreduce";
      case OpType::kAllgather: return "MPI_Iallgatherv";
      case OpType::kBroadcast: return "MPI_Ibcast";
      case OpType::kAlltoall: return "MPI_Isend/MPI_Irecv pairs";
      case OpType::kReducescatter: return "MPI_Ireduce_scatter";
      default: return "MPI_Ibarrier";
    }
  }
  bool supports(OpType, DataType, DeviceType device) const override {
    return device == DeviceType::kCpu;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(const void* in, void* out, int64_t n, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("allreduce");
    MPI_Datatype type = info_.shared->datatype(dtype);
    MPI_Op mpi_op = info_.shared->reduceOp(dtype, op);
    if (n < 0) count(n, what);
    const int64_t esz = dataTypeSize(dtype), chunk = info_.shared->maxMessageElements();
    for (int64_t off = 0; off < n; off += chunk) {
      int pieces = static_cast<int>(std::min(chunk, n - off));
      const void* src = in == out ? MPI_IN_PLACE : at(in, off, esz);
      if (pieces * esz >= kBlockingAllreduceBytes) {
        info_.poison->throwIfPoisoned();
        info_.shared->runWithWatchdog(deadline, what, [&] {
          check(MPI_Allreduce(src, at(out, off, esz), pieces, type, mpi_op, info_.comm),
                "MPI_Allreduce", what);
        });
        continue;
      }
      MPI_Request request = MPI_REQUEST_NULL;
      check(MPI_Iallreduce(src, at(out, off, esz), pieces, type, mpi_op, info_.comm, &request),
            "MPI_Iallreduce", what);
      wait(request, deadline, start, what);
    }
  }

  // Fits one call: MPI_Iallgatherv. Else every member broadcasts its block in chunks.
  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("allgatherv");
    checkCounts(counts, what);
    const int64_t esz = dataTypeSize(dtype), limit = info_.shared->maxMessageElements();
    int64_t total = 0, mine = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) mine = total;
      total += counts[r];
    }
    if (total > limit) {
      if (counts[rank_] > 0 && in != at(out, mine, esz))
        std::memmove(at(out, mine, esz), in, counts[rank_] * esz);
      int64_t offset = 0;
      for (int r = 0; r < size_; offset += counts[r], ++r)
        broadcastChunks(at(out, offset, esz), counts[r], dtype, r, deadline, start, what);
      return;
    }
    for (int r = 0, offset = 0; r < size_; offset += recv_counts_[r], ++r) {
      recv_counts_[r] = static_cast<int>(counts[r]);  // total <= limit <= INT_MAX
      recv_displs_[r] = offset;
    }
    const void* src = in == at(out, mine, esz) ? MPI_IN_PLACE : orEmpty(in);
    MPI_Datatype type = info_.shared->datatype(dtype);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgatherv(src, recv_counts_[rank_], type, orEmpty(out), recv_counts_.data(),
                          recv_displs_.data(), type, info_.comm, &request),
          "MPI_Iallgatherv", what);
    wait(request, deadline, start, what);
  }

  void broadcast(void* buf, int64_t n, DataType dtype, int root, Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("broadcast");
    if (root < 0 || root >= size_)
      throwError(StatusCode::kInvalidArgument, what + ": root must be in [0, " +
                                                   std::to_string(size_) + "), got " +
                                                   std::to_string(root));
    broadcastChunks(buf, n, dtype, root, deadline, start, what);
  }

  // Point-to-point: member i sends send_counts[j] elements to j, in chunks that one MPI
  // call can carry; both sides know every pair's count, so no count leaves int range.
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("alltoallv");
    const auto totals = checkAlltoallvCounts(send_counts, recv_counts, rank_, size_, what);
    const int64_t send_total = totals.send, recv_total = totals.recv;
    const int64_t esz = dataTypeSize(dtype), limit = info_.shared->maxMessageElements();
    const void* src = in;
    if (overlap(in, send_total * esz, out, recv_total * esz)) {  // MPI forbids aliasing
      growStaging(send_total * esz);
      std::memcpy(staging_.data(), in, send_total * esz);
      src = staging_.data();
    }
    MPI_Datatype type = info_.shared->datatype(dtype);
    requests_.clear();
    int64_t send_offset = 0, recv_offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        if (send_counts[r] > 0)
          std::memcpy(at(out, recv_offset, esz), at(src, send_offset, esz), send_counts[r] * esz);
      } else {
        for (int64_t off = 0; off < recv_counts[r]; off += limit)
          post(MPI_Irecv(at(out, recv_offset + off, esz),
                         static_cast<int>(std::min(limit, recv_counts[r] - off)), type, r, 0,
                         info_.comm, next()),
               "MPI_Irecv", what);
        for (int64_t off = 0; off < send_counts[r]; off += limit)
          post(MPI_Isend(at(src, send_offset + off, esz),
                         static_cast<int>(std::min(limit, send_counts[r] - off)), type, r, 0,
                         info_.comm, next()),
               "MPI_Isend", what);
      }
      send_offset += send_counts[r];
      recv_offset += recv_counts[r];
    }
    waitRequests(requests_.data(), static_cast<int>(requests_.size()), deadline, start, what,
                 *info_.poison, *info_.shared);
  }

  // Fits one call: MPI_Ireduce_scatter. Else block r is reduced to member r in chunks.
  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("reducescatter");
    checkCounts(counts, what);
    MPI_Datatype type = info_.shared->datatype(dtype);
    MPI_Op mpi_op = info_.shared->reduceOp(dtype, op);
    const int64_t esz = dataTypeSize(dtype), limit = info_.shared->maxMessageElements();
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (total > limit) return reduceBlocks(in, out, counts, dtype, op, deadline, start, what);
    for (int r = 0; r < size_; ++r) recv_counts_[r] = static_cast<int>(counts[r]);
    const int64_t mine = counts[rank_] * esz;
    // out == in: MPI_IN_PLACE (block rank_ lands at the start); other aliasing: stage.
    const void* src = in == out ? MPI_IN_PLACE : orEmpty(in);
    void* dst = orEmpty(out);
    bool staged = in != out && overlap(in, total * esz, out, mine);
    if (staged) {
      growStaging(mine);
      dst = staging_.data();
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter(src, dst, recv_counts_.data(), type, mpi_op, info_.comm,
                              &request),
          "MPI_Ireduce_scatter", what);
    wait(request, deadline, start, what);
    if (staged && mine > 0) std::memcpy(out, staging_.data(), mine);
  }

  void barrier(Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("barrier");
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(info_.comm, &request), "MPI_Ibarrier", what);
    wait(request, deadline, start, what);
  }

  void abort(const std::string& reason) override {
    info_.poison->poison(StatusCode::kAborted, reason);
  }

 private:
  void checkCounts(const std::vector<int64_t>& counts, const std::string& what) const {
    checkMemberCounts(counts, size_, what);
  }
  void growStaging(int64_t bytes) {
    if (static_cast<int64_t>(staging_.size()) < bytes) staging_.resize(bytes);
  }
  MPI_Request* next() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  // Checks the return code of a call that posted requests_.back(); on failure the requests
  // already posted are abandoned (they reference the caller's memory).
  void post(int rc, const char* call, const std::string& what) {
    if (rc == MPI_SUCCESS) return;
    requests_.pop_back();
    for (MPI_Request request : requests_) info_.shared->abandon(request);
    requests_.clear();
    check(rc, call, what);
  }

  void broadcastChunks(void* buf, int64_t n, DataType dtype, int root, Deadline deadline,
                       Clock::time_point start, const std::string& what) {
    if (n < 0) count(n, what);
    const int64_t esz = dataTypeSize(dtype), chunk = info_.shared->maxMessageElements();
    for (int64_t off = 0; off < n; off += chunk) {
      MPI_Request request = MPI_REQUEST_NULL;
      check(MPI_Ibcast(at(buf, off, esz), static_cast<int>(std::min(chunk, n - off)),
                       info_.shared->datatype(dtype), root, info_.comm, &request),
            "MPI_Ibcast", what);
      wait(request, deadline, start, what);
    }
  }

  // Reducescatter too large for one call: for each member r in order, chunks of block r are
  // reduced to r through a staging buffer of at most kStagingBytes, then copied to `out`.
  // Blocks are done in member order, so out == in works: writing block r's result over the
  // start of `in` only touches input that blocks < r already consumed.
  void reduceBlocks(const void* in, void* out, const std::vector<int64_t>& counts,
                    DataType dtype, ReduceOp op, Deadline deadline, Clock::time_point start,
                    const std::string& what) {
    constexpr int64_t kStagingBytes = 16 << 20;
    const int64_t esz = dataTypeSize(dtype);
    const int64_t chunk = std::min(info_.shared->maxMessageElements(), kStagingBytes / esz);
    MPI_Datatype type = info_.shared->datatype(dtype);
    MPI_Op mpi_op = info_.shared->reduceOp(dtype, op);
    if (counts[rank_] > 0) growStaging(std::min(counts[rank_], chunk) * esz);
    int64_t offset = 0;
    for (int r = 0; r < size_; offset += counts[r], ++r)
      for (int64_t off = 0; off < counts[r]; off += chunk) {
        const int64_t n = std::min(chunk, counts[r] - off);
        MPI_Request request = MPI_REQUEST_NULL;
        check(MPI_Ireduce(at(in, offset + off, esz), r == rank_ ? staging_.data() : nullptr,
                          static_cast<int>(n), type, mpi_op, r, info_.comm, &request),
              "MPI_Ireduce", what);
        wait(request, deadline, start, what);
        if (r == rank_) std::memcpy(at(out, off, esz), staging_.data(), n * esz);
      }
  }

  std::vector<int> recv_counts_ = std::vector<int>(size_), recv_displs_ = std::vector<int>(size_);
  std::vector<MPI_Request> requests_;
  std::vector<uint8_t> staging_;  // grows, never shrinks: no large allocation per op
};

class MpiControlPlane : public ControlPlane, private MpiMember {
 public:
  using MpiMember::MpiMember;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // 1. MPI_Igather of every member's length to rank 0. 2. MPI_Igatherv of the bytes.
  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("control-plane gather");
    int64_t length = static_cast<int64_t>(bytes.size());
    std::vector<int64_t> lengths(rank_ == 0 ? size_ : 0);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Igather(&length, 1, MPI_INT64_T, orEmpty(lengths.data()), 1, MPI_INT64_T, 0,
                      info_.comm, &request),
          "MPI_Igather", what);
    wait(request, deadline, start, what);
    std::vector<int> counts(lengths.size()), displs(lengths.size());
    int64_t total = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
      counts[r] = count(lengths[r], what);
      displs[r] = count(total, what);
      total += lengths[r];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check(MPI_Igatherv(orEmpty(bytes.data()), count(length, what), MPI_BYTE, orEmpty(&all[0]),
                       counts.data(), displs.data(), MPI_BYTE, 0, info_.comm, &request),
          "MPI_Igatherv", what);
    wait(request, deadline, start, what);
    std::vector<std::string> result;
    for (size_t r = 0; r < lengths.size(); ++r) result.push_back(all.substr(displs[r], counts[r]));
    return result;
  }

  // 1. MPI_Ibcast of rank 0's length. 2. MPI_Ibcast of its bytes.
  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("control-plane broadcast");
    int64_t length = static_cast<int64_t>(bytes.size());
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(&length, 1, MPI_INT64_T, 0, info_.comm, &request), "MPI_Ibcast", what);
    wait(request, deadline, start, what);
    std::string result = rank_ == 0 ? bytes : std::string(static_cast<size_t>(length), '\0');
    if (length == 0) return result;
    check(MPI_Ibcast(&result[0], count(length, what), MPI_BYTE, 0, info_.comm, &request),
          "MPI_Ibcast", what);
    wait(request, deadline, start, what);
    return result;
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    auto start = Clock::now();
    std::string what = begin("control-plane allreduceAnd");
    if (bits.empty()) return;
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, bits.data(), count(bits.size(), what), MPI_UINT64_T,
                         MPI_BAND, info_.comm, &request),
          "MPI_Iallreduce", what);
    wait(request, deadline, start, what);
  }

  void abort(const std::string& reason) override {
    info_.poison->poison(StatusCode::kAborted, reason);
  }
};

}  // namespace

std::unique_ptr<ControlPlane> makeMpiControlPlane(MpiGroupInfo info) {
  return std::make_unique<MpiControlPlane>(std::move(info));
}

std::unique_ptr<Backend> makeMpiBackend(MpiGroupInfo info) {
  return std::make_unique<MpiBackend>(std::move(info));
}

}  // namespace detail
}  // namespace tutti
