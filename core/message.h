// What ranks tell the coordinator (Request, RequestList) and what it answers (Response,
// ResponseList), and their wire format: little-endian, length-prefixed, versioned. Parsing
// checks every length against the buffer and throws Error(kInternal) on a malformed message.
#pragma once

#include "base/common.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tutti {

struct Request {
  int32_t rank = 0;  // group rank of the sender (set by the coordinator on receipt)
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  DeviceType device = DeviceType::kCpu;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall send splits; process-set ranks for kAddProcessSet
  std::string group;            // grouped allreduce: the group's key ("" = none)
  int32_t group_size = 0;
  // OpOptions::ordered: agreed by position among the set's ordered ops (Negotiator). Local:
  // not on the wire (a request that is negotiated in full is matched by name).
  bool ordered = false;

  bool operator==(const Request& other) const;
};

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
};

enum class ResponseType : uint8_t { kOp = 0, kError = 1 };

struct Response {
  ResponseType type = ResponseType::kOp;
  OpType op = OpType::kAllreduce;
  std::vector<std::string> names;  // more than one when fused
  std::vector<int64_t> counts;     // elements per name (allreduce: what a joined rank sends)
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  DeviceType device = DeviceType::kCpu;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> first_dims;  // allgather: rows on each rank
  std::vector<int64_t> splits;      // alltoall: size x size send splits (row = sender);
                                    // kAddProcessSet: its ranks
  int32_t value = -1;               // join: last joined rank; kRemoveProcessSet: the id
  StatusCode error_code = StatusCode::kOk;
  std::string error_message;
};

struct ResponseList {
  std::vector<Response> responses;
  std::string fatal_error;  // set by the root to stop the job (stall shutdown)
};

std::string serialize(const RequestList& list);
// serialize() of a list (not shutting down) of requests held elsewhere (queue entries).
std::string serializeRequests(const std::vector<const Request*>& requests);
RequestList parseRequestList(const std::string& bytes);
std::string serialize(const ResponseList& list);
ResponseList parseResponseList(const std::string& bytes);

// What a member checks of a response from its set's root before the executor uses it, given
// the set's size: one row count per member that sum within int64 (allgather), size x size
// splits (alltoall), a root inside the set (broadcast). Throws Error(kInternal) naming the
// tensor, what was expected and what came.
void checkResponseForSet(const Response& r, int set_size);

}  // namespace tutti
