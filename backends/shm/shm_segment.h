// The shared-memory segment of one process set whose members all run on this host, and
// the one synchronisation step every shm operation is built from. Internal to backends/shm.
//
// Layout (one POSIX shared-memory object per set, mapped by every member):
//   ShmHeader | ShmRankState x size | data: 2 buffers x size slots x buffer_bytes
// Slot (p, j) belongs to member j: only j writes it, every member may read it.
//
// Protocol (steps of every op):
//   1. beginEpoch(): the op takes the next epoch e; this member may write its slot in
//      buffer e % 2 (mine()).
//   2. round(): publishes seq = ++seq_ (store-release) and waits until every member's seq
//      has reached it (load-acquire). After it, everything each member wrote before its
//      own round() is visible: the slots of buffer e % 2 can be read.
//   3. More rounds may follow in the same epoch (allreduce: reduce, then round, then read
//      the reduced slices).
// Why two buffers suffice: a member writes buffer e % 2 again only in epoch e + 2, after
// the first round of epoch e + 1, which every member publishes only after it finished
// reading epoch e. So no member overwrites data another member may still read.
//
// Failures: every wait has the op's deadline; while waiting, a member checks every few
// milliseconds that the members it waits for are alive (/proc/<pid>/stat, the pid and its
// start time recorded at creation), and fails at once, naming the member, when one has
// died. poison() marks the segment so that every member's next or current wait fails fast
// with the same reason.
//
// Thread-safety: one thread at a time (the runtime's execution stream) runs the ops; poison() and poisoned()
// may be called from any thread.
#pragma once

#include "backends/backend.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

struct ShmHeader;
struct ShmRankState;

struct ShmOptions {
  // Per member per buffer (rounded up to pages). 0: the root picks (autoBufferBytes), and
  // halves it while /dev/shm has no room, down to 64 KiB. Members that ask for different
  // sizes make the set decline shm.
  int64_t buffer_bytes = 0;
  double setup_seconds = 30;       // deadline of the collective setup
  bool enabled = true;             // this member's TUTTI_SHM
  bool alltoall = true;            // the backend runs alltoall (else leaves it to the next)
  // Broadcasts of [next_broadcast_from, next_broadcast_below) bytes are handed to `next`
  // (the transport's backend of the same set) when it is given.
  Backend* next = nullptr;
  int64_t next_broadcast_from = 0, next_broadcast_below = 0;
};

class ShmSegment {
 public:
  // Collective over the members of `control` (world ranks `ranks`, process set `id`).
  // Returns a segment when every member runs on this host (same host identity), enables
  // shm and could map the segment; otherwise nullptr on every member, and `why_not` says
  // why. The segment's name is unlinked before this returns on any member.
  static std::unique_ptr<ShmSegment> create(ControlPlane& control, const std::vector<int>& ranks,
                                            int id, const ShmOptions& options,
                                            std::string* why_not);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t bufferBytes() const { return buffer_bytes_; }
  // The buffer size auto (ShmOptions::buffer_bytes 0) starts from for `members` members.
  static int64_t autoBufferBytes(int members);
  // "rank 3: shm allreduce on group 2 (world ranks 0, 3)".
  std::string where(const char* op) const;
  // Names an op in its error messages (where(op)), spelled out only when a message is built:
  // building it for every op was a quarter of a lone op's instructions on the background
  // thread (callgrind).
  class What {
   public:
    What(const ShmSegment& seg, const char* op) : seg_(&seg), op_(op) {}
    std::string text() const { return seg_->where(op_); }

   private:
    const ShmSegment* seg_;
    const char* op_;
  };
  What what(const char* op) const { return What(*this, op); }

  void beginEpoch() { ++epoch_; }
  uint8_t* mine() { return slot(rank_); }
  const uint8_t* slot(int member) const;  // member's slot of the current epoch's buffer
  uint8_t* slot(int member);

  // Publishes this member's arrival and waits for every member's (see the protocol).
  // Throws Error(kTimeout) at the deadline, Error(kBackend) when a member died, and the
  // poison's code (kAborted after abort()) when the segment was poisoned; the first two
  // poison the segment first.
  void round(Deadline deadline, const What& what);

  void throwIfPoisoned(const What& what) const;
  // The first reason sticks; every member's waits fail with it.
  void poison(StatusCode code, const std::string& reason);

 private:
  ShmSegment() = default;
  void waitFor(int member, uint64_t target, Deadline deadline, const What& what);
  [[noreturn]] void fail(StatusCode code, const std::string& message);
  std::string memberName(int member) const;

  std::string name_;  // unlinked; the key of this process's shared mapping
  void* base_ = nullptr;
  size_t bytes_ = 0;
  ShmHeader* header_ = nullptr;
  ShmRankState* states_ = nullptr;
  uint8_t* data_ = nullptr;
  int rank_ = 0, size_ = 1, id_ = 0;
  std::vector<int> ranks_;
  mutable std::string where_tail_;  // where()'s " on group ..." part, built on first use
  int64_t buffer_bytes_ = 0;
  int spins_ = 1000;  // 0 when the members have fewer CPUs between them than members
  uint64_t epoch_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace detail
}  // namespace tutti
