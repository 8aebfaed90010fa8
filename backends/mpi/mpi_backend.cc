// MPI data plane and control plane: every op is made of non-blocking MPI calls on the
// group's own communicator, waited for with a deadline (waitRequest), so that abort() from
// another thread interrupts any of them within one poll. Ops larger than one MPI call can
// carry (int counts and displacements) are split into chunks.
#include "backends/mpi/mpi_backend.h"

#include "base/reduce.h"

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
    if (!finalized && !info_.poison->poisonedHere() && info_.comm != MPI_COMM_NULL)
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

// From this size on, allreduce is a ring of MPI_Isend/MPI_Irecv pairs reduced here
// (ringAllreduce): Open MPI's libnbc MPI_Iallreduce is up to 2x slower than its blocking
// MPI_Allreduce at these sizes, and a blocking call cannot be interrupted by abort(); the
// ring is as fast as the blocking call (faster at np=2) and waits like every other op.
constexpr int64_t kRingAllreduceBytes = 64 << 10;
// The ring moves each block in segments of at most this many bytes (the staging buffer).
constexpr int64_t kRingSegmentBytes = 4 << 20;
constexpr int kRingTag = 1;  // alltoallv's pairs use tag 0

class MpiBackend : public Backend, private MpiMember {
 public:
  using MpiMember::MpiMember;
  const char* name() const override { return "mpi"; }
  const char* algorithm(OpType op, int64_t bytes) const override {
    switch (op) {  // Open MPI's coll component picks the algorithm inside each call
      case OpType::kAllreduce:
        return bytes >= kRingAllreduceBytes ? "ring of MPI_Isend/MPI_Irecv" : "MPI_Iallreduce";
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
    if (n * esz >= kRingAllreduceBytes && size_ > 1) {
      if (in != out) std::memmove(out, in, n * esz);
      ringAllreduce(out, n, dtype, op, deadline, start, what);
      return;
    }
    for (int64_t off = 0; off < n; off += chunk) {
      int pieces = static_cast<int>(std::min(chunk, n - off));
      const void* src = in == out ? MPI_IN_PLACE : at(in, off, esz);
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

  // Ring allreduce of buf in place: (1) reduce-scatter: in step s member i sends block
  // i - s to member i + 1 and reduces block i - s - 1 from member i - 1 into its own, so
  // after size - 1 steps it holds block i + 1 fully reduced; (2) allgather: in step s it
  // sends block i + 1 - s and receives block i - s in place. Every block is reduced in the
  // same order whichever member computes it, and then copied, so all members end with the
  // same bits. A step moves its blocks in segments of at most kRingSegmentBytes (and one
  // MPI call's count); in (1) two segments are received ahead into staging_ while the one
  // before is reduced. An error cancels the receives still posted (buf is the caller's).
  void ringAllreduce(void* buf, int64_t n, DataType dtype, ReduceOp op, Deadline deadline,
                     Clock::time_point start, const std::string& what) {
    const int64_t esz = dataTypeSize(dtype);
    const int64_t segment = std::max<int64_t>(
        1, std::min(info_.shared->maxMessageElements(), kRingSegmentBytes / esz));
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    auto first = [&](int block) { return n / size_ * block + std::min<int64_t>(block, n % size_); };
    auto length = [&](int block) { return first(block + 1) - first(block); };
    auto mod = [&](int b) { return ((b % size_) + size_) % size_; };
    auto pieces = [&](int64_t total) { return (total + segment - 1) / segment; };
    auto piece = [&](int64_t total, int64_t k) { return std::min(segment, total - k * segment); };
    const MPI_Datatype type = info_.shared->datatype(dtype);
    const int64_t slot_bytes = std::min(length(0), segment) * esz;  // block 0 is the largest
    growStaging(2 * slot_bytes);
    for (int phase = 0; phase < 2; ++phase)
      for (int s = 0; s < size_ - 1; ++s) {
        const int send = phase == 0 ? mod(rank_ - s) : mod(rank_ + 1 - s);
        const int recv = phase == 0 ? mod(rank_ - s - 1) : mod(rank_ - s);
        const int64_t send_n = length(send), recv_n = length(recv);
        const int64_t recvs = pieces(recv_n), sends = pieces(send_n);
        // requests_: the receives [0, recvs), then the sends.
        requests_.assign(static_cast<size_t>(recvs + sends), MPI_REQUEST_NULL);
        auto slot = [&](int64_t k) { return staging_.data() + (k % 2) * slot_bytes; };
        auto target = [&](int64_t k) { return at(buf, first(recv) + k * segment, esz); };
        auto postRecv = [&](int64_t k) {
          check(MPI_Irecv(phase == 0 ? slot(k) : target(k), static_cast<int>(piece(recv_n, k)),
                          type, left, kRingTag, info_.comm, &requests_[k]),
                "MPI_Irecv", what);
        };
        int64_t waiting_from = -1, waiting_to = -1;  // the range waitRequests abandons
        auto waitFor = [&](int64_t from, int64_t to) {
          if (to <= from) return;
          waiting_from = from;
          waiting_to = to;
          waitRequests(&requests_[from], static_cast<int>(to - from), deadline, start, what,
                       *info_.poison, *info_.shared);
          waiting_from = waiting_to = -1;
        };
        try {
          for (int64_t k = 0; k < (phase == 0 ? std::min<int64_t>(2, recvs) : recvs); ++k)
            postRecv(k);
          for (int64_t k = 0; k < sends; ++k)
            check(MPI_Isend(at(buf, first(send) + k * segment, esz),
                            static_cast<int>(piece(send_n, k)), type, right, kRingTag,
                            info_.comm, &requests_[recvs + k]),
                  "MPI_Isend", what);
          if (phase == 0)
            for (int64_t k = 0; k < recvs; ++k) {
              waitFor(k, k + 1);
              reduceInto(target(k), slot(k), piece(recv_n, k), dtype, op);
              if (k + 2 < recvs) postRecv(k + 2);
            }
          waitFor(0, recvs + sends);
        } catch (const Error&) {
          // A late peer must not write into buf (or staging_) after this returns: cancel the
          // receives; keep every request still pending for the shutdown check.
          for (int64_t k = 0; k < recvs + sends; ++k) {
            MPI_Request& request = requests_[k];
            if (request == MPI_REQUEST_NULL) continue;
            if (k < recvs) MPI_Cancel(&request);
            if (k < waiting_from || k >= waiting_to) info_.shared->abandon(request);
          }
          throw;
        }
      }
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
