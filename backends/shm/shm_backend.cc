// Shared-memory collectives over a ShmSegment (see shm_segment.h for the epoch and round
// protocol). Every op moves data in chunks of at most one slot per member per epoch:
//   allreduce, small (<= kSmallBytes): each member copies its input into its slot; round;
//     every member reduces all slots (in member order) into its output. One round.
//   allreduce, large: per chunk, 1. each member copies its chunk into its slot; round;
//     2. member r reduces slice r of the chunk over all slots (in member order) into its
//     output and copies the result back into slice r of its own slot; round; 3. each member
//     copies the other members' reduced slices into its output. Every member reduces 1/n.
//     A fused allreduce (allreducePieces) runs the same on its tensors seen as one array:
//     they are copied into the slot and out of the slots one by one, with no fusion buffer.
//   allgatherv: each member copies its block's piece into its slot; round; all copy.
//   broadcast: the root copies a piece into its slot; round; the others copy it out.
//     Sizes the options hand to the next backend (over MPI) go there instead.
//   reducescatter: each member's slot holds one region per destination member; round;
//     member r reduces region r of every slot into its output.
//   alltoallv: counts are exchanged first (one round), then one region per other member
//     (member i's block for j is in region (j - i - 1) mod n of i's slot, so none is idle).
// Every member runs the same number of epochs and rounds (computed from arguments that
// are the same on every member), so the rounds stay matched.
#include "backends/shm/shm_backend.h"

#include "base/logging.h"
#include "base/reduce.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace tutti {
namespace {

using detail::ShmSegment;

// Up to this size an allreduce takes the one-round path.
constexpr int64_t kSmallBytes = 16 << 10;

uint8_t* at(void* base, int64_t elements, int64_t esz) {
  return static_cast<uint8_t*>(base) + elements * esz;
}
const uint8_t* at(const void* base, int64_t elements, int64_t esz) {
  return static_cast<const uint8_t*>(base) + elements * esz;
}
bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
void copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
}
// Elements [first, end) of a block of `count` elements that epoch `e` carries, `per` per
// epoch.
struct Piece {
  int64_t first, count;
};
Piece piece(int64_t count, int64_t e, int64_t per) {
  int64_t first = std::min(count, e * per);
  return {first, std::min(count, first + per) - first};
}
int64_t epochsFor(int64_t max_count, int64_t per) { return (max_count + per - 1) / per; }

// The pieces of a fused allreduce seen as one array of `total` elements: ranges of it are
// gathered from the inputs, scattered to the outputs, or visited piece by piece.
class Pieces {
 public:
  // `starts` is the caller's persistent vector, refilled with each piece's first element.
  Pieces(const std::vector<AllreducePiece>& pieces, int64_t esz, int64_t total,
         std::vector<int64_t>& starts, const ShmSegment::What& what)
      : pieces_(pieces), starts_(starts), esz_(esz) {
    starts_.resize(pieces.size() + 1);
    int64_t sum = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (pieces[k].count < 0)
        throwError(StatusCode::kInvalidArgument, what.text() + ": piece " + std::to_string(k) +
                                                     " has count " +
                                                     std::to_string(pieces[k].count));
      starts_[k] = sum;
      sum += pieces[k].count;
    }
    starts_[pieces.size()] = sum;
    if (sum != total)
      throwError(StatusCode::kInternal, what.text() + ": the pieces hold " + std::to_string(sum) +
                                            " elements, expected " + std::to_string(total));
  }
  // f(piece, first element in the piece, position in the array, count) for each piece's part
  // of [first, first + count), in order.
  template <class F>
  void forEach(int64_t first, int64_t count, F&& f) const {
    size_t k = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end() - 1, first) - starts_.begin() - 1);
    while (count > 0 && k < pieces_.size()) {
      const int64_t in_piece = first - starts_[k];
      const int64_t c = std::min(count, pieces_[k].count - in_piece);
      if (c > 0) {
        f(pieces_[k], in_piece, first, c);
        first += c;
        count -= c;
      }
      ++k;
    }
  }
  // dst <- elements [first, first + count) (a piece without input gives zeros).
  void gather(uint8_t* dst, int64_t first, int64_t count) const {
    forEach(first, count, [&](const AllreducePiece& p, int64_t in_piece, int64_t pos, int64_t c) {
      uint8_t* to = dst + (pos - first) * esz_;
      if (p.in == nullptr)
        std::memset(to, 0, static_cast<size_t>(c * esz_));
      else
        copy(to, at(p.in, in_piece, esz_), c * esz_);
    });
  }
  // Elements [first, first + count) <- src (dropped where a piece has no output).
  void scatter(const uint8_t* src, int64_t first, int64_t count) const {
    forEach(first, count, [&](const AllreducePiece& p, int64_t in_piece, int64_t pos, int64_t c) {
      if (p.out != nullptr) copy(at(p.out, in_piece, esz_), src + (pos - first) * esz_, c * esz_);
    });
  }

 private:
  const std::vector<AllreducePiece>& pieces_;
  std::vector<int64_t>& starts_;
  const int64_t esz_;
};

class ShmBackend : public Backend {
 public:
  ShmBackend(std::unique_ptr<ShmSegment> seg, const detail::ShmOptions& options)
      : seg_(std::move(seg)), ptrs_(seg_->size()), options_(options) {}
  const char* name() const override { return "shm"; }
  bool supports(OpType op, DataType, DeviceType device) const override {
    return device == DeviceType::kCpu && (options_.alltoall || op != OpType::kAlltoall);
  }
  int rank() const override { return seg_->rank(); }
  int size() const override { return seg_->size(); }
  // Broadcasts of these sizes go to the next backend (MPI's are faster there).
  bool handsOnBroadcast(int64_t bytes) const {
    return options_.next && bytes >= options_.next_broadcast_from &&
           bytes < options_.next_broadcast_below;
  }
  const char* algorithm(OpType op, int64_t bytes) const override {
    switch (op) {
      case OpType::kAllreduce:
        return bytes <= std::min(kSmallBytes, seg_->bufferBytes()) ? "shm one-round"
                                                                   : "shm reduce-scatter+allgather";
      case OpType::kReducescatter: return "shm regions, each member reduces its own";
      case OpType::kAlltoall: return "shm regions, counts first";
      case OpType::kBarrier: return "shm round";
      case OpType::kBroadcast:
        if (handsOnBroadcast(bytes)) return options_.next->algorithm(op, bytes);
        return "shm slots";
      default: return "shm slots";
    }
  }

  void allreduce(const void* in, void* out, int64_t n, DataType dtype, ReduceOp op,
                 Deadline deadline) override {
    one_[0] = AllreducePiece{in, out, n};
    allreducePieces(one_, n, dtype, op, deadline);
  }

  bool allreducesPieces() const override { return true; }
  // The pieces are one array of `total` elements (Pieces): each member copies them into its
  // slot and the result out of the slots once, without a fusion buffer in between.
  void allreducePieces(const std::vector<AllreducePiece>& pieces, int64_t total, DataType dtype,
                       ReduceOp op, Deadline deadline) override {
    const ShmSegment::What what = begin("allreduce");
    checkCount(total, what);
    const int64_t esz = dataTypeSize(dtype), size = seg_->size(), me = seg_->rank();
    Pieces all(pieces, esz, total, starts_, what);
    if (total == 0) return;
    if (size == 1) {
      all.forEach(0, total, [&](const AllreducePiece& p, int64_t in_piece, int64_t, int64_t c) {
        if (p.out == nullptr) return;
        if (p.in == nullptr) return std::memset(at(p.out, in_piece, esz), 0, c * esz), void();
        copy(at(p.out, in_piece, esz), at(p.in, in_piece, esz), c * esz);
      });
      return;
    }
    if (total * esz <= std::min(kSmallBytes, seg_->bufferBytes())) {
      seg_->beginEpoch();
      all.gather(seg_->mine(), 0, total);
      seg_->round(deadline, what);
      all.forEach(0, total, [&](const AllreducePiece& p, int64_t in_piece, int64_t pos, int64_t c) {
        if (p.out == nullptr) return;
        for (int j = 0; j < size; ++j) ptrs_[j] = seg_->slot(j) + pos * esz;
        reduceMany(at(p.out, in_piece, esz), ptrs_.data(), static_cast<int>(size), c, dtype, op);
      });
      return;
    }
    const int64_t chunk = seg_->bufferBytes() / esz;
    const int64_t align = std::max<int64_t>(1, 64 / esz);
    for (int64_t off = 0; off < total; off += chunk) {
      const int64_t m = std::min(chunk, total - off);
      const int64_t per = ((m + size - 1) / size + align - 1) / align * align;
      seg_->beginEpoch();
      all.gather(seg_->mine(), off, m);
      seg_->round(deadline, what);
      // This member's slice, reduced in member order into the outputs (or, for a piece
      // without one, a scratch buffer) and copied back into its slot for the others.
      Piece mine = piece(m, me, per);
      if (mine.count > 0) {
        all.forEach(off + mine.first, mine.count,
                    [&](const AllreducePiece& p, int64_t in_piece, int64_t pos, int64_t c) {
                      const int64_t in_slot = pos - off;
                      for (int j = 0; j < size; ++j) ptrs_[j] = seg_->slot(j) + in_slot * esz;
                      uint8_t* dst = p.out != nullptr ? at(p.out, in_piece, esz)
                                                      : scratch(c * esz);
                      reduceMany(dst, ptrs_.data(), static_cast<int>(size), c, dtype, op);
                      copy(seg_->mine() + in_slot * esz, dst, c * esz);
                    });
      }
      seg_->round(deadline, what);
      for (int j = 0; j < size; ++j) {
        Piece p = piece(m, j, per);
        if (j != me && p.count > 0)
          all.scatter(seg_->slot(j) + p.first * esz, off + p.first, p.count);
      }
    }
  }

  void allgatherv(const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                  Deadline deadline) override {
    const ShmSegment::What what = begin("allgatherv");
    checkCounts(counts, what);
    const int64_t esz = dataTypeSize(dtype), size = seg_->size(), me = seg_->rank();
    const std::vector<int64_t>& offsets = offsetsOf(counts);
    uint8_t* my_block = at(out, offsets[me], esz);
    if (in != my_block && overlap(in, counts[me] * esz, out, offsets[size] * esz))
      in = stage(in, counts[me] * esz);
    const int64_t per = seg_->bufferBytes() / esz;
    const int64_t epochs = size == 1 ? 0 : epochsFor(maxOf(counts), per);
    for (int64_t e = 0; e < epochs; ++e) {
      seg_->beginEpoch();
      Piece own = piece(counts[me], e, per);
      copy(seg_->mine(), at(in, own.first, esz), own.count * esz);
      seg_->round(deadline, what);
      for (int j = 0; j < size; ++j) {
        Piece p = piece(counts[j], e, per);
        if (j != me) copy(at(out, offsets[j] + p.first, esz), seg_->slot(j), p.count * esz);
      }
    }
    copy(my_block, in, counts[me] * esz);
  }

  void broadcast(void* buf, int64_t n, DataType dtype, int root, Deadline deadline) override {
    const int64_t bytes = n * dataTypeSize(dtype);  // the same on every member
    if (handsOnBroadcast(bytes)) return options_.next->broadcast(buf, n, dtype, root, deadline);
    const ShmSegment::What what = begin("broadcast");
    checkCount(n, what);
    if (root < 0 || root >= seg_->size())
      throwError(StatusCode::kInvalidArgument, what.text() + ": root must be in [0, " +
                                                   std::to_string(seg_->size()) + "), got " +
                                                   std::to_string(root));
    const int64_t esz = dataTypeSize(dtype), per = seg_->bufferBytes() / esz;
    const int64_t epochs = seg_->size() == 1 ? 0 : epochsFor(n, per);
    for (int64_t e = 0; e < epochs; ++e) {
      Piece p = piece(n, e, per);
      seg_->beginEpoch();
      if (seg_->rank() == root) copy(seg_->mine(), at(buf, p.first, esz), p.count * esz);
      seg_->round(deadline, what);
      if (seg_->rank() != root) copy(at(buf, p.first, esz), seg_->slot(root), p.count * esz);
    }
  }

  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype,
                 Deadline deadline) override {
    const ShmSegment::What what = begin("alltoallv");
    const int64_t esz = dataTypeSize(dtype), size = seg_->size(), me = seg_->rank();
    const auto totals = checkAlltoallvCounts(send_counts, recv_counts, static_cast<int>(me),
                                             static_cast<int>(size), what.text());
    const int64_t send_total = totals.send, recv_total = totals.recv;
    if (overlap(in, send_total * esz, out, recv_total * esz)) in = stage(in, send_total * esz);
    // 1. Every member learns the largest block of any pair, so that all run as many epochs.
    int64_t largest = 0;
    if (size > 1) {
      seg_->beginEpoch();
      copy(seg_->mine(), send_counts.data(), size * static_cast<int64_t>(sizeof(int64_t)));
      seg_->round(deadline, what);
      for (int j = 0; j < size; ++j) {
        const auto* theirs = reinterpret_cast<const int64_t*>(seg_->slot(j));
        largest = std::max(largest, *std::max_element(theirs, theirs + size));
      }
    }
    // 2. Region j of a member's slot carries its block for member j.
    const int64_t region = regionBytes(std::max<int64_t>(1, size - 1)), per = region / esz;
    const int64_t epochs = size == 1 ? 0 : epochsFor(largest, per);
    auto regionOf = [&](int64_t from, int64_t to) { return (to - from - 1 + size) % size; };
    const std::vector<int64_t>& send_off = offsetsOf(send_counts);
    for (int64_t e = 0; e < epochs; ++e) {
      seg_->beginEpoch();
      for (int j = 0; j < size; ++j) {
        Piece p = piece(send_counts[j], e, per);
        if (j != me)
          copy(seg_->mine() + regionOf(me, j) * region, at(in, send_off[j] + p.first, esz),
               p.count * esz);
      }
      seg_->round(deadline, what);
      for (int64_t j = 0, off = 0; j < size; off += recv_counts[j], ++j) {
        Piece p = piece(recv_counts[j], e, per);
        if (j != me)
          copy(at(out, off + p.first, esz), seg_->slot(j) + regionOf(j, me) * region,
               p.count * esz);
      }
    }
    int64_t my_recv = 0;
    for (int j = 0; j < me; ++j) my_recv += recv_counts[j];
    copy(at(out, my_recv, esz), at(in, send_off[me], esz), send_counts[me] * esz);
  }

  void reducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                     DataType dtype, ReduceOp op, Deadline deadline) override {
    const ShmSegment::What what = begin("reducescatter");
    checkCounts(counts, what);
    const int64_t esz = dataTypeSize(dtype), size = seg_->size(), me = seg_->rank();
    const std::vector<int64_t>& offsets = offsetsOf(counts);
    if (size == 1) return copy(out, in, counts[0] * esz);
    // out == in is safe (epoch e writes out below where later epochs read); other
    // overlaps are staged.
    if (in != out && overlap(in, offsets[size] * esz, out, counts[me] * esz))
      in = stage(in, offsets[size] * esz);
    const int64_t region = regionBytes(size), per = region / esz;
    const int64_t epochs = epochsFor(maxOf(counts), per);
    for (int64_t e = 0; e < epochs; ++e) {
      seg_->beginEpoch();
      for (int j = 0; j < size; ++j) {
        Piece p = piece(counts[j], e, per);
        copy(seg_->mine() + j * region, at(in, offsets[j] + p.first, esz), p.count * esz);
      }
      seg_->round(deadline, what);
      Piece p = piece(counts[me], e, per);
      for (int j = 0; j < size; ++j) ptrs_[j] = seg_->slot(j) + me * region;
      reduceMany(at(out, p.first, esz), ptrs_.data(), static_cast<int>(size), p.count, dtype,
                 op);
    }
  }

  void barrier(Deadline deadline) override {
    const ShmSegment::What what = begin("barrier");
    if (seg_->size() > 1) seg_->round(deadline, what);
  }

  void abort(const std::string& reason) override { seg_->poison(StatusCode::kAborted, reason); }

 private:
  ShmSegment::What begin(const char* op) const {
    ShmSegment::What what = seg_->what(op);
    seg_->throwIfPoisoned(what);
    return what;
  }
  static void checkCount(int64_t n, const ShmSegment::What& what) {
    if (n < 0)
      throwError(StatusCode::kInvalidArgument,
                 what.text() + ": count must be >= 0, got " + std::to_string(n));
  }
  void checkCounts(const std::vector<int64_t>& counts, const ShmSegment::What& what) const {
    checkMemberCounts(counts, seg_->size(), what.text());
  }
  static int64_t maxOf(const std::vector<int64_t>& counts) {
    return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  }
  // Where each member's block starts (and, last, the total), in offsets_.
  const std::vector<int64_t>& offsetsOf(const std::vector<int64_t>& counts) {
    offsets_.assign(counts.size() + 1, 0);
    for (size_t j = 0; j < counts.size(); ++j) offsets_[j + 1] = offsets_[j] + counts[j];
    return offsets_;
  }
  // A member's slot split into `regions` cache-line-aligned regions.
  int64_t regionBytes(int64_t regions) const {
    return seg_->bufferBytes() / regions / 64 * 64;
  }
  // Persistent room for `bytes` bytes of a reduction whose result is dropped.
  uint8_t* scratch(int64_t bytes) {
    if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }
  // A persistent copy of an input that aliases the output.
  const void* stage(const void* in, int64_t bytes) {
    if (static_cast<int64_t>(staging_.size()) < bytes) staging_.resize(bytes);
    copy(staging_.data(), in, bytes);
    return staging_.data();
  }

  std::unique_ptr<ShmSegment> seg_;
  std::vector<const void*> ptrs_;
  std::vector<int64_t> offsets_;
  std::vector<uint8_t> staging_;
  std::vector<uint8_t> scratch_;
  std::vector<AllreducePiece> one_ = std::vector<AllreducePiece>(1);
  std::vector<int64_t> starts_;
  const detail::ShmOptions options_;
};

}  // namespace

std::unique_ptr<Backend> makeShmBackend(ControlPlane& control, const std::vector<int>& ranks,
                                        int id, const detail::ShmOptions& options) {
  std::string why_not;
  auto seg = ShmSegment::create(control, ranks, id, options, &why_not);
  if (!seg) {
    TUTTI_LOG(kDebug) << "process set " << id << " does not use shm: " << why_not;
    return nullptr;
  }
  return std::make_unique<ShmBackend>(std::move(seg), options);
}

std::unique_ptr<Backend> makeShmBackend(ControlPlane& control, const std::vector<int>& ranks,
                                        int id, const BackendOptions& options,
                                        const std::string& transport, Backend& next) {
  detail::ShmOptions shm;
  // Measured (docs/PERFORMANCE.md, "Ops other than allreduce"): Open MPI's alltoall, which
  // copies once between the processes, beats shm's chunked one from 1 MiB, and its
  // broadcast beats shm's from 256 KiB to 4 MiB; everything else is faster on shm.
  shm.alltoall = transport != "mpi";
  if (transport == "mpi") {
    shm.next = &next;
    shm.next_broadcast_from = 256 << 10;
    shm.next_broadcast_below = 8 << 20;
  }
  shm.enabled = options.shm;
  shm.buffer_bytes = options.shm_buffer_bytes;
  shm.setup_seconds = options.start_timeout_seconds;
  return makeShmBackend(control, ranks, id, shm);
}

}  // namespace tutti
