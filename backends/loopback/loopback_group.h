// Shared state of one loopback group (process set): the rendezvous of its members, which are
// threads of one process. Internal to backends/loopback.
#pragma once

#include "backends/loopback/loopback.h"
#include "base/common.h"
#include "base/first_error.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

class LoopbackGroup;

// What one member contributes to one step: pointers into its own memory, valid until the
// member departs the op. Other members read them between arrive() and depart().
struct LoopbackPost {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const std::vector<int64_t>* counts = nullptr;       // allgatherv, reducescatter, send
  const std::vector<int64_t>* recv_counts = nullptr;  // alltoallv
  const std::string* bytes = nullptr;                 // control plane
  const std::vector<uint64_t>* bits = nullptr;        // control plane
  int64_t scratch_bytes = 0;  // shared scratch this member needs for the op
};

// One rendezvous point (the data plane and the control plane each have their own, so that
// negotiation and data movement never consume each other's arrivals).
//
// Protocol of one op, identical on every member:
//   1. arrive(post): store this member's post, wait (with the deadline) until every member
//      has arrived; the last arriver grows the shared scratch to the largest scratch_bytes.
//   2. read the other members' posts (their memory) and write own output / own slice of
//      the scratch. Nothing in this step waits.
//   3. depart(): wait until every member is done reading. No deadline and no poison check
//      here: every member that passed step 1 gets here after a bounded amount of local
//      work, and leaving early would let a caller free memory a peer still reads.
//   4. optionally copy from the scratch into own memory; the scratch is only rewritten
//      after the next op's step 1, which every member must have reached.
// A barrier is step 1 alone. Thread-safety: one thread per member at a time; members run
// concurrently.
class LoopbackChannel {
 public:
  LoopbackChannel(LoopbackGroup& group, const char* kind);

  // Step 1. On timeout poisons the group and throws Error(kTimeout) naming the ranks that
  // did not arrive; throws the group's sticky error if it is poisoned. `start` is when the
  // op began (the message gives deadline - start).
  void arrive(int member, const LoopbackPost& post, Deadline deadline, Clock::time_point start,
              const char* op);
  void depart(int member);  // step 3
  const LoopbackPost& post(int member) const { return posts_[member]; }
  uint8_t* scratch() { return scratch_.data(); }
  void wakeAll();

 private:
  bool arriveLocked(int member);  // true if this was the last arrival of the step

  LoopbackGroup& group_;
  const char* kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int arrived_count_ = 0;
  std::vector<char> arrived_;
  std::vector<LoopbackPost> posts_;
  std::vector<uint8_t> scratch_;  // grows, never shrinks: no large allocation per op
};

// Members, id, sticky poison and the two channels of one group.
class LoopbackGroup {
 public:
  LoopbackGroup(std::vector<int> ranks, int id);
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int id() const { return id_; }
  LoopbackChannel& data() { return data_; }
  LoopbackChannel& control() { return control_; }

  bool poisoned() const { return poison_.isSet(); }
  void throwIfPoisoned() const { poison_.throwIfSet(); }
  // The first poison sticks; wakes every waiter of both channels.
  void poison(StatusCode code, const std::string& message);
  void setPoison(StatusCode code, const std::string& message) {  // without waking anyone
    poison_.set(code, message);
  }
  void wakeAll();

 private:
  const std::vector<int> ranks_;
  const int id_;
  FirstError poison_;
  LoopbackChannel data_;
  LoopbackChannel control_;
};

}  // namespace detail

// Shared by the threads of one job. Thread-safe.
class LoopbackHub {
 public:
  explicit LoopbackHub(int world_size);
  int size() const { return world_size_; }
  // The group with this id, created by the first member that asks; every member must pass
  // the same ranks. A group lives while some member holds it.
  std::shared_ptr<detail::LoopbackGroup> group(const std::vector<int>& ranks, int id, int rank);

 private:
  const int world_size_;
  std::mutex mu_;
  std::map<int, std::weak_ptr<detail::LoopbackGroup>> groups_;
};

}  // namespace tutti
