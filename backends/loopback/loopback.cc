// Loopback transport, control plane and backend: ranks are threads sharing a LoopbackHub.
// Every op follows the protocol described in loopback_group.h (arrive with a post, read
// the peers' memory, depart). Arguments are validated against member 0's post identically
// on every member, so either all members throw or none does.
#include "backends/loopback/loopback.h"

#include "backends/loopback/loopback_group.h"
#include "base/reduce.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <utility>

namespace tutti {
namespace {

using detail::LoopbackChannel;
using detail::LoopbackGroup;
using detail::LoopbackPost;

const uint8_t* bytesAt(const void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<const uint8_t*>(base) + elements * element_bytes;
}
uint8_t* bytesAt(void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<uint8_t*>(base) + elements * element_bytes;
}

// The group's shared state plus this member's place in it.
class Member {
 public:
  Member(std::shared_ptr<LoopbackGroup> group, int world_rank)
      : group_(std::move(group)), world_rank_(world_rank) {
    const auto& ranks = group_->ranks();
    member_ = static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), world_rank) -
                               ranks.begin());
  }

 protected:
  std::string where(const char* op) const {
    return "rank " + std::to_string(world_rank_) + ": loopback " + op + " on group " +
           std::to_string(group_->id());
  }
  [[noreturn]] void mismatch(const char* op, const char* what, int other, int64_t mine,
                             int64_t theirs) const {
    throwError(StatusCode::kMismatch,
               where(op) + ": members passed different " + what + ": rank " +
                   std::to_string(group_->ranks()[0]) + " passed " + std::to_string(mine) +
                   ", rank " + std::to_string(group_->ranks()[other]) + " passed " +
                   std::to_string(theirs));
  }
  // Throws (on every member alike) unless every member posted the same value.
  template <typename Get>
  void checkSame(LoopbackChannel& channel, const char* op, const char* what, Get get) const {
    for (int m = 1; m < group_->size(); ++m) {
      int64_t first = get(channel.post(0)), other = get(channel.post(m));
      if (first != other) mismatch(op, what, m, first, other);
    }
  }
  // Runs `body` (validation and reads of the peers' posts), then departs even when body
  // threw, so that no member leaves (or posts the next op) while a peer still reads.
  template <typename Body>
  void readThenDepart(LoopbackChannel& channel, Body body) {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    channel.depart(member_);
    if (error) std::rethrow_exception(error);
  }
  void checkCounts(const char* op, const std::vector<int64_t>& counts) const {
    if (static_cast<int>(counts.size()) != group_->size())
      throwError(StatusCode::kInvalidArgument,
                 where(op) + ": expected one count per member (" +
                     std::to_string(group_->size()) + "), got " + std::to_string(counts.size()));
    for (int64_t c : counts)
      if (c < 0)
        throwError(StatusCode::kInvalidArgument,
                   where(op) + ": counts must be >= 0, got " + std::to_string(c));
  }

  std::shared_ptr<LoopbackGroup> group_;
  int world_rank_;
  int member_ = 0;
};

int64_t postDtype(const LoopbackPost& p) { return static_cast<int64_t>(p.dtype); }
int64_t postOp(const LoopbackPost& p) { return static_cast<int64_t>(p.op); }

class LoopbackBackend : public Backend, private Member {
 public:
  using Member::Member;
  const char* name() const override { return "loopback"; }
  const char* algorithm(OpType, int64_t) const override { return "in-process copy"; }
  bool supports(OpType, DataType, DeviceType device) const override {
    return device == DeviceType::kCpu;
  }
  int rank() const override { return member_; }
  int size() const override { return group_->size(); }

  void allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    auto start = Clock::now();
    checkReduce("allreduce", count, op);
    const int64_t esz = dataTypeSize(dtype);
    if (size() == 1) {  // a world of one: no scratch round trip
      group_->throwIfPoisoned();
      if (in != out && count > 0) std::memmove(out, in, count * esz);
      return;
    }
    LoopbackPost post;
    post.in = in;
    post.out = out;
    post.count = count;
    post.dtype = dtype;
    post.op = op;
    post.scratch_bytes = count * esz;
    auto& ch = group_->data();
    ch.arrive(member_, post, deadline, start, "allreduce");
    readThenDepart(ch, [&] {
      checkSame(ch, "allreduce", "counts", [](const LoopbackPost& p) { return p.count; });
      checkSame(ch, "allreduce", "dtypes", postDtype);
      checkSame(ch, "allreduce", "reduce ops", postOp);
      // Member m reduces elements [lo, hi) of every member's input into the shared scratch.
      const int n = size();
      const int64_t lo = count * member_ / n, hi = count * (member_ + 1) / n;
      uint8_t* acc = bytesAt(ch.scratch(), lo, esz);
      if (hi > lo) {
        std::memcpy(acc, bytesAt(ch.post(0).in, lo, esz), (hi - lo) * esz);
        for (int m = 1; m < n; ++m)
          reduceInto(acc, bytesAt(ch.post(m).in, lo, esz), hi - lo, dtype, op);
      }
    });
    if (count > 0) std::memcpy(out, ch.scratch(), count * esz);
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    auto start = Clock::now();
    checkCounts("allgatherv", counts);
    const int64_t esz = dataTypeSize(dtype);
    LoopbackPost post;
    post.in = in;
    post.dtype = dtype;
    post.counts = &counts;
    auto& ch = group_->data();
    ch.arrive(member_, post, deadline, start, "allgatherv");
    readThenDepart(ch, [&] {
      checkSame(ch, "allgatherv", "dtypes", postDtype);
      for (int m = 0; m < size(); ++m)
        checkSame(ch, "allgatherv", "counts",
                  [m](const LoopbackPost& p) { return (*p.counts)[m]; });
      int64_t offset = 0;
      for (int m = 0; m < size(); ++m) {
        uint8_t* dst = bytesAt(out, offset, esz);
        if (counts[m] > 0 && dst != ch.post(m).in)
          std::memcpy(dst, ch.post(m).in, counts[m] * esz);
        offset += counts[m];
      }
    });
  }

  void broadcast(void* buf, int64_t count, DataType dtype, int root, Deadline deadline) override {
    auto start = Clock::now();
    if (root < 0 || root >= size())
      throwError(StatusCode::kInvalidArgument, where("broadcast") + ": root must be in [0, " +
                                                   std::to_string(size()) + "), got " +
                                                   std::to_string(root));
    if (count < 0) badCount("broadcast", count);
    LoopbackPost post;
    post.out = buf;
    post.count = count;
    post.dtype = dtype;
    post.root = root;
    auto& ch = group_->data();
    ch.arrive(member_, post, deadline, start, "broadcast");
    readThenDepart(ch, [&] {
      checkSame(ch, "broadcast", "counts", [](const LoopbackPost& p) { return p.count; });
      checkSame(ch, "broadcast", "dtypes", postDtype);
      checkSame(ch, "broadcast", "roots", [](const LoopbackPost& p) { return int64_t(p.root); });
      if (member_ != root && count > 0)
        std::memcpy(buf, ch.post(root).out, count * dataTypeSize(dtype));
    });
  }

  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    auto start = Clock::now();
    checkCounts("alltoallv", send_counts);
    checkCounts("alltoallv", recv_counts);
    const int64_t esz = dataTypeSize(dtype);
    LoopbackPost post;
    post.in = in;
    post.out = out;
    post.dtype = dtype;
    post.counts = &send_counts;
    post.recv_counts = &recv_counts;
    auto& ch = group_->data();
    ch.arrive(member_, post, deadline, start, "alltoallv");
    readThenDepart(ch, [&] {
      checkSame(ch, "alltoallv", "dtypes", postDtype);
      const int n = size();
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          int64_t sent = (*ch.post(i).counts)[j], received = (*ch.post(j).recv_counts)[i];
          if (sent != received)
            throwError(StatusCode::kMismatch,
                       where("alltoallv") + ": rank " + std::to_string(group_->ranks()[i]) +
                           " sends " + std::to_string(sent) + " elements to rank " +
                           std::to_string(group_->ranks()[j]) + ", which expects " +
                           std::to_string(received));
        }
      int64_t recv_offset = 0;
      for (int m = 0; m < n; ++m) {
        const auto& peer_counts = *ch.post(m).counts;
        int64_t send_offset = std::accumulate(peer_counts.begin(), peer_counts.begin() + member_,
                                              int64_t{0});
        if (recv_counts[m] > 0)
          std::memcpy(bytesAt(out, recv_offset, esz), bytesAt(ch.post(m).in, send_offset, esz),
                      recv_counts[m] * esz);
        recv_offset += recv_counts[m];
      }
    });
  }

  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    auto start = Clock::now();
    checkCounts("reducescatter", counts);
    checkReduce("reducescatter", 0, op);
    const int64_t esz = dataTypeSize(dtype);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t offset =
        std::accumulate(counts.begin(), counts.begin() + member_, int64_t{0});
    LoopbackPost post;
    post.in = in;
    post.dtype = dtype;
    post.op = op;
    post.counts = &counts;
    post.scratch_bytes = total * esz;
    auto& ch = group_->data();
    ch.arrive(member_, post, deadline, start, "reducescatter");
    const int64_t mine = counts[member_];
    uint8_t* acc = nullptr;
    readThenDepart(ch, [&] {
      acc = bytesAt(ch.scratch(), offset, esz);
      checkSame(ch, "reducescatter", "dtypes", postDtype);
      checkSame(ch, "reducescatter", "reduce ops", postOp);
      for (int m = 0; m < size(); ++m)
        checkSame(ch, "reducescatter", "counts",
                  [m](const LoopbackPost& p) { return (*p.counts)[m]; });
      // Own block goes through the scratch: `out` may alias a peer-visible input.
      if (mine > 0) {
        std::memcpy(acc, bytesAt(ch.post(0).in, offset, esz), mine * esz);
        for (int m = 1; m < size(); ++m)
          reduceInto(acc, bytesAt(ch.post(m).in, offset, esz), mine, dtype, op);
      }
    });
    if (mine > 0) std::memcpy(out, acc, mine * esz);
  }

  void barrier(Deadline deadline) override {
    LoopbackPost post;
    group_->data().arrive(member_, post, deadline, Clock::now(), "barrier");
  }

  void abort(const std::string& reason) override {
    group_->poison(StatusCode::kAborted, reason);
  }

 private:
  [[noreturn]] void badCount(const char* op, int64_t count) const {
    throwError(StatusCode::kInvalidArgument,
               where(op) + ": count must be >= 0, got " + std::to_string(count));
  }
  void checkReduce(const char* op, int64_t count, ReduceOp reduce) const {
    if (count < 0) badCount(op, count);
    if (reduce == ReduceOp::kAverage)
      throwError(StatusCode::kInvalidArgument,
                 where(op) + ": reduce op average must be turned into sum + scale by the core");
  }
};

class LoopbackControlPlane : public ControlPlane, private Member {
 public:
  using Member::Member;
  int rank() const override { return member_; }
  int size() const override { return group_->size(); }

  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    auto start = Clock::now();
    LoopbackPost post;
    post.bytes = &bytes;
    auto& ch = group_->control();
    ch.arrive(member_, post, deadline, start, "gather");
    std::vector<std::string> result;
    readThenDepart(ch, [&] {
      if (member_ == 0)
        for (int m = 0; m < size(); ++m) result.push_back(*ch.post(m).bytes);
    });
    return result;
  }

  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    auto start = Clock::now();
    LoopbackPost post;
    post.bytes = &bytes;
    auto& ch = group_->control();
    ch.arrive(member_, post, deadline, start, "broadcast");
    std::string result;
    readThenDepart(ch, [&] { result = *ch.post(0).bytes; });
    return result;
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    auto start = Clock::now();
    LoopbackPost post;
    post.bits = &bits;
    auto& ch = group_->control();
    ch.arrive(member_, post, deadline, start, "allreduceAnd");
    std::vector<uint64_t> result;
    readThenDepart(ch, [&] {
      checkSame(ch, "control-plane allreduceAnd", "bit-vector lengths",
                [](const LoopbackPost& p) { return int64_t(p.bits->size()); });
      result = *ch.post(0).bits;
      for (int m = 1; m < size(); ++m)
        for (size_t i = 0; i < result.size(); ++i) result[i] &= (*ch.post(m).bits)[i];
    });
    bits = std::move(result);
  }

  void abort(const std::string& reason) override {
    group_->poison(StatusCode::kAborted, reason);
  }
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank)
      : hub_(std::move(hub)), rank_(rank) {}
  const char* name() const override { return "loopback"; }
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::unique_ptr<ControlPlane> makeControlPlane(const std::vector<int>& ranks,
                                                 int id) override {
    return std::make_unique<LoopbackControlPlane>(hub_->group(ranks, id, rank_), rank_);
  }
  std::unique_ptr<Backend> makeBackend(const std::vector<int>& ranks, int id) override {
    return std::make_unique<LoopbackBackend>(hub_->group(ranks, id, rank_), rank_);
  }

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace

std::shared_ptr<LoopbackHub> makeLoopbackHub(int world_size) {
  return std::make_shared<LoopbackHub>(world_size);
}

std::unique_ptr<Transport> makeLoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) {
  if (!hub) throwError(StatusCode::kInvalidArgument, "loopback transport: hub is null");
  if (rank < 0 || rank >= hub->size())
    throwError(StatusCode::kInvalidArgument,
               "loopback transport: rank must be in [0, " + std::to_string(hub->size()) +
                   "), got " + std::to_string(rank));
  return std::make_unique<LoopbackTransport>(std::move(hub), rank);
}

}  // namespace tutti
