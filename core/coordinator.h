// The negotiation state of one process set, kept by its rank 0 (the root).
//
// Each round the root:
//   a. adds every member's new requests to the message table (name -> request per rank);
//   b. marks a name ready once every member has submitted it or has joined;
//   c. validates a ready name (same op, dtype, device, shape/trailing dims, reduce op,
//      scale factors, root, splits, group on every rank) and turns it into a Response, or
//      into an ERROR response naming the tensor, the field and the ranks;
//   d. holds a grouped allreduce back until every tensor of its group is ready; a tensor
//      that fails (the ranks grouped it differently, say) fails its groups as a whole, on
//      every rank, including the tensors only some ranks submitted;
//   e. answers join once every member has joined.
// Pure: no threads, no communication, no clock of its own. Not thread-safe.
#pragma once

#include "core/message.h"

#include <map>
#include <string>
#include <vector>

namespace tutti {

struct StallInfo {
  std::string name;
  OpType op;
  std::vector<int> missing_ranks;
  double waited_seconds;
};

class Coordinator {
 public:
  explicit Coordinator(int size);

  // a-e for one member's requests; `rank` is the member's index in the set.
  void addRequests(int rank, const std::vector<Request>& requests, Clock::time_point now);
  // The responses decided since the last call, in decision order.
  std::vector<Response> takeReady();
  bool hasPending() const { return !table_.empty() || joined_count_ > 0; }
  // Names waiting longer than `seconds` for some ranks.
  std::vector<StallInfo> stalled(Clock::time_point now, double seconds) const;

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> have;
    Clock::time_point first_seen;
  };
  void checkReady(const std::string& name);
  Response build(const std::string& name, const Pending& pending) const;
  void emit(Response response, const Request& sample);
  // A grouped tensor failed (`why`; ranks that grouped it differently, say): its groups fail
  // as a whole once the batch is in (failGroups), instead of waiting for tensors that never
  // come.
  void noteFailedGroups(const Pending& pending, const std::string& why);
  void failGroups();

  int size_;
  std::map<std::string, Pending> table_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::map<std::string, std::vector<Response>> groups_;  // group key -> ready members
  std::map<std::string, std::string> failed_groups_;     // group key -> why, this batch
  std::vector<Response> ready_;
};

}  // namespace tutti
