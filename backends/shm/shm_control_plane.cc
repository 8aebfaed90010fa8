// The shm control plane. Each op is a sequence of epochs (shm_segment.h); in each, every
// member writes a 16-byte header {bytes in this piece, bytes still to come after it} and
// the piece into its slot, then one round. Every member reads every header, so all agree
// on whether another epoch follows, however unequal the members' messages are.
//   gather: every member sends; the root appends each piece to that member's message.
//   broadcast: only the root's header and piece count.
//   allreduceAnd: the vector (same length everywhere) in slices; every member ANDs all.
#include "backends/shm/shm_control_plane.h"

#include "backends/shm/shm_segment.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace tutti {
namespace {

using detail::ShmSegment;

struct PieceHeader {
  uint64_t bytes;
  uint64_t remaining;  // after this piece
};

class ShmControlPlane : public ControlPlane {
 public:
  // `inner` made the segment and stays for nothing but abort (its channel is idle).
  ShmControlPlane(std::unique_ptr<ControlPlane> inner, std::unique_ptr<ShmSegment> seg)
      : inner_(std::move(inner)), seg_(std::move(seg)) {}
  int rank() const override { return seg_->rank(); }
  int size() const override { return seg_->size(); }

  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    const ShmSegment::What what = begin("gather");
    std::vector<std::string> out(seg_->rank() == 0 ? seg_->size() : 0);
    sendPieces(bytes, deadline, what, [&](int member, const uint8_t* data, uint64_t n) {
      if (seg_->rank() == 0) out[member].append(reinterpret_cast<const char*>(data), n);
    });
    return out;
  }

  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    const ShmSegment::What what = begin("broadcast");
    std::string out;
    sendPieces(seg_->rank() == 0 ? bytes : std::string(), deadline, what,
               [&](int member, const uint8_t* data, uint64_t n) {
                 if (member == 0) out.append(reinterpret_cast<const char*>(data), n);
               });
    return out;
  }

  void allreduceAnd(std::vector<uint64_t>& bits, Deadline deadline) override {
    const ShmSegment::What what = begin("allreduceAnd");
    if (seg_->size() == 1) return;
    const size_t per = static_cast<size_t>(seg_->bufferBytes()) / sizeof(uint64_t);
    size_t first = 0;
    do {  // at least one round, also for an empty vector: the members stay in step
      const size_t n = std::min(per, bits.size() - first);
      seg_->beginEpoch();
      if (n > 0) std::memcpy(seg_->mine(), bits.data() + first, n * sizeof(uint64_t));
      seg_->round(deadline, what);
      for (int j = 0; j < seg_->size(); ++j) {
        const auto* theirs = reinterpret_cast<const uint64_t*>(seg_->slot(j));
        for (size_t i = 0; i < n; ++i) bits[first + i] &= theirs[i];
      }
      first += n;
    } while (first < bits.size());
  }

  void abort(const std::string& reason) override {
    seg_->poison(StatusCode::kAborted, reason);
    inner_->abort(reason);
  }

 private:
  ShmSegment::What begin(const char* op) const {
    ShmSegment::What what = seg_->what(op);
    seg_->throwIfPoisoned(what);
    return what;
  }

  // Every member sends `bytes` (empty ones too) in pieces; `take(member, data, n)` sees
  // every member's piece of every epoch. Ends when no member has bytes left.
  template <typename Take>
  void sendPieces(const std::string& bytes, Deadline deadline, const ShmSegment::What& what,
                  Take take) {
    const uint64_t capacity = static_cast<uint64_t>(seg_->bufferBytes()) - sizeof(PieceHeader);
    uint64_t sent = 0;
    for (bool more = true; more;) {
      seg_->beginEpoch();
      PieceHeader mine{std::min<uint64_t>(capacity, bytes.size() - sent), 0};
      mine.remaining = bytes.size() - sent - mine.bytes;
      std::memcpy(seg_->mine(), &mine, sizeof mine);
      if (mine.bytes > 0)
        std::memcpy(seg_->mine() + sizeof mine, bytes.data() + sent, mine.bytes);
      sent += mine.bytes;
      seg_->round(deadline, what);
      more = false;
      for (int j = 0; j < seg_->size(); ++j) {
        PieceHeader h;
        std::memcpy(&h, seg_->slot(j), sizeof h);
        take(j, seg_->slot(j) + sizeof h, h.bytes);
        more = more || h.remaining > 0;
      }
    }
  }

  std::unique_ptr<ControlPlane> inner_;
  std::unique_ptr<ShmSegment> seg_;
};

}  // namespace

std::unique_ptr<ControlPlane> makeShmControlPlane(std::unique_ptr<ControlPlane>& set,
                                                  const std::vector<int>& ranks, int id,
                                                  const BackendOptions& options) {
  detail::ShmOptions shm;
  shm.enabled = options.shm;
  shm.buffer_bytes = 64 << 10;  // negotiation messages are small; larger ones chunk
  shm.setup_seconds = options.start_timeout_seconds;
  auto seg = ShmSegment::create(*set, ranks, id, shm, nullptr);
  if (!seg) return nullptr;
  return std::make_unique<ShmControlPlane>(std::move(set), std::move(seg));
}

}  // namespace tutti
