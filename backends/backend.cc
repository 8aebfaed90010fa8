// Argument checks every CPU backend makes the same way, exchangeLines, and the default of the
// scaled reductions (backend.h).
#include "backends/backend.h"

#include <sstream>

namespace tutti {

std::vector<std::string> exchangeLines(ControlPlane& control, const std::string& line,
                                       Deadline deadline) {
  std::string all;
  for (const auto& l : control.gather(line, deadline)) all += l + "\n";
  all = control.broadcast(all, deadline);
  std::vector<std::string> lines;
  std::istringstream in(all);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

void checkMemberCounts(const std::vector<int64_t>& counts, int members, const std::string& what) {
  if (static_cast<int>(counts.size()) != members)
    throwError(StatusCode::kInvalidArgument,
               what + ": expected one count per member (" + std::to_string(members) +
                   "), got " + std::to_string(counts.size()));
  for (int64_t c : counts)
    if (c < 0)
      throwError(StatusCode::kInvalidArgument,
                 what + ": counts must be >= 0, got " + std::to_string(c));
}

AlltoallvTotals checkAlltoallvCounts(const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts, int me,
                                     int members, const std::string& what) {
  checkMemberCounts(send_counts, members, what);
  checkMemberCounts(recv_counts, members, what);
  if (recv_counts[me] != send_counts[me])
    throwError(StatusCode::kInvalidArgument,
               what + ": sends " + std::to_string(send_counts[me]) +
                   " elements to itself but expects " + std::to_string(recv_counts[me]));
  AlltoallvTotals totals;
  for (int j = 0; j < members; ++j) {
    totals.send += send_counts[j];
    totals.recv += recv_counts[j];
  }
  return totals;
}

namespace {
[[noreturn]] void noScaling(const Backend& backend, const char* op) {
  throwError(StatusCode::kUnsupported,
             std::string(backend.name()) + " backend: " + op + " with scaling is not supported");
}
}  // namespace

std::string Backend::scalingRefusal(DataType, ReduceOp, const ReduceScaling&) const {
  return std::string("the ") + name() + " backend cannot scale a reduction";
}

void Backend::allreduceScaled(const void*, void*, int64_t, DataType, ReduceOp,
                              const ReduceScaling&, Deadline) {
  noScaling(*this, "allreduce");
}

void Backend::reducescatterScaled(const void*, void*, const std::vector<int64_t>&, DataType,
                                  ReduceOp, const ReduceScaling&, Deadline) {
  noScaling(*this, "reducescatter");
}

void Backend::allreducePieces(const std::vector<AllreducePiece>&, int64_t, DataType, ReduceOp,
                              Deadline) {
  throwError(StatusCode::kInternal,
             std::string(name()) + " backend: no fused allreduce from pieces (allreducesPieces)");
}

}  // namespace tutti
