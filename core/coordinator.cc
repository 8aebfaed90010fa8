#include "core/coordinator.h"

#include "core/validation.h"

#include <cmath>
#include <sstream>

namespace tutti {
namespace {

std::string describe(const Request& q) { return std::string(opTypeName(q.op)) + " " + quotedName(q.name); }

template <typename T>
std::string str(const T& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Scale factors: equal, or both NaN (they then scale alike on every rank).
bool sameScale(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

int groupSize(const Request& q) { return q.group.empty() ? 1 : q.group_size; }

// The first field on which `b` (rank rb) disagrees with `a` (rank ra), as a message.
std::string firstMismatch(const Request& a, int ra, const Request& b, int rb) {
  auto msg = [&](const char* field, const std::string& va, const std::string& vb) {
    return describe(a) + ": " + field + " " + va + " on rank " + std::to_string(ra) + " but " +
           vb + " on rank " + std::to_string(rb);
  };
  if (a.op != b.op) return msg("op", opTypeName(a.op), opTypeName(b.op));
  if (a.dtype != b.dtype) return msg("dtype", dataTypeName(a.dtype), dataTypeName(b.dtype));
  if (a.device != b.device)
    return msg("device", deviceTypeName(a.device), deviceTypeName(b.device));
  if (groupSize(a) != groupSize(b))
    return msg("group size", std::to_string(groupSize(a)), std::to_string(groupSize(b)));
  if (a.group != b.group) return msg("group", "'" + a.group + "'", "'" + b.group + "'");
  switch (a.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      if (a.reduce_op != b.reduce_op)
        return msg("reduce op", reduceOpName(a.reduce_op), reduceOpName(b.reduce_op));
      if (!sameScale(a.prescale, b.prescale))
        return msg("prescale", numberText(a.prescale), numberText(b.prescale));
      if (!sameScale(a.postscale, b.postscale))
        return msg("postscale", numberText(a.postscale), numberText(b.postscale));
      if (a.shape != b.shape) return msg("shape", shapeString(a.shape), shapeString(b.shape));
      break;
    case OpType::kBroadcast:
      if (a.root != b.root) return msg("root", str(a.root), str(b.root));
      if (a.shape != b.shape) return msg("shape", shapeString(a.shape), shapeString(b.shape));
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall: {
      std::vector<int64_t> ta(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end());
      std::vector<int64_t> tb(b.shape.begin() + (b.shape.empty() ? 0 : 1), b.shape.end());
      if (a.shape.size() != b.shape.size() || ta != tb)
        return msg("trailing dimensions (all but the first) of shape", shapeString(a.shape),
                   shapeString(b.shape));
      break;
    }
    case OpType::kAddProcessSet:
      if (a.splits != b.splits) {
        std::vector<int> sa(a.splits.begin(), a.splits.end()), sb(b.splits.begin(), b.splits.end());
        return msg("ranks", "[" + joinInts(sa) + "]", "[" + joinInts(sb) + "]");
      }
      break;
    case OpType::kRemoveProcessSet:
      if (a.root != b.root) return msg("process set", str(a.root), str(b.root));
      break;
    case OpType::kBarrier:
    case OpType::kJoin:
      break;
  }
  return "";
}

// "" when an output of sum(rows) rows shaped like `a`'s trailing dimensions fits
// kMaxTensorBytes, else the message (the rows come from every rank).
std::string outputTooLarge(const Request& a, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = a.shape;
  shape[0] = 0;
  bool ok = true;
  for (int64_t n : rows) ok = ok && checkedAdd(shape[0], n, &shape[0]);
  int64_t bytes = 0;
  if (ok && tensorBytes(shape, a.dtype, &bytes)) return "";
  return describe(a) + ": the output would be too large (rows from ranks 0.." +
         std::to_string(rows.size() - 1) + ": " + shapeString(rows) + " with trailing shape " +
         shapeString(std::vector<int64_t>(a.shape.begin() + 1, a.shape.end())) + " of " +
         dataTypeName(a.dtype) + "; expected at most " + std::to_string(kMaxTensorBytes) +
         " bytes)";
}

}  // namespace

Coordinator::Coordinator(int size) : size_(size), joined_(size, false) {}

void Coordinator::addRequests(int rank, const std::vector<Request>& requests,
                              Clock::time_point now) {
  for (const Request& in : requests) {
    Request q = in;
    q.rank = rank;
    if (q.op == OpType::kJoin) {
      if (!joined_[rank]) {
        joined_[rank] = true;
        ++joined_count_;
      }
      last_joined_ = rank;
      // Tensors that only the newly joined rank was missing are ready now.
      std::vector<std::string> names;
      for (const auto& kv : table_) names.push_back(kv.first);
      for (const auto& name : names) checkReady(name);
      if (joined_count_ == size_) {
        Response r;
        r.op = OpType::kJoin;
        r.names = {q.name};
        r.value = last_joined_;
        ready_.push_back(std::move(r));
        joined_.assign(size_, false);
        joined_count_ = 0;
      }
      continue;
    }
    auto it = table_.find(q.name);
    if (it == table_.end()) {
      Pending p;
      p.by_rank.resize(size_);
      p.have.assign(size_, false);
      p.first_seen = now;
      it = table_.emplace(q.name, std::move(p)).first;
    }
    it->second.by_rank[rank] = q;
    it->second.have[rank] = true;
    checkReady(q.name);
  }
  failGroups();
}

void Coordinator::noteFailedGroups(const Pending& p, const std::string& why) {
  // Every group the tensor belongs to on some rank: ranks that grouped it differently can
  // never complete their groups as one, and a group with a failed tensor fails anyway.
  for (int r = 0; r < size_; ++r)
    if (p.have[r] && !p.by_rank[r].group.empty())
      failed_groups_.emplace(p.by_rank[r].group, why);
}

void Coordinator::failGroups() {
  // Once a rank's whole batch is in (a rank submits a group at once), every tensor of a
  // failed group fails: those ready wait no longer for the rest, and those some ranks
  // never submit (the larger group's extra tensors) get the error on every rank.
  for (const auto& failed : failed_groups_) {
    auto held = groups_.find(failed.first);
    if (held != groups_.end()) {
      for (auto& r : held->second) ready_.push_back(std::move(r));
      groups_.erase(held);
    }
    for (auto it = table_.begin(); it != table_.end();) {
      const Pending& p = it->second;
      int r = 0;
      while (r < size_ && !(p.have[r] && p.by_rank[r].group == failed.first)) ++r;
      if (r == size_) {
        ++it;
        continue;
      }
      Response e;
      e.type = ResponseType::kError;
      e.op = p.by_rank[r].op;
      e.names = {it->first};
      e.error_code = StatusCode::kMismatch;
      e.error_message = describe(p.by_rank[r]) + " (in a group of " +
                        std::to_string(p.by_rank[r].group_size) + " on rank " +
                        std::to_string(r) + "): its group cannot run: " + failed.second;
      ready_.push_back(std::move(e));
      it = table_.erase(it);
    }
  }
  failed_groups_.clear();
}

void Coordinator::checkReady(const std::string& name) {
  auto it = table_.find(name);
  if (it == table_.end()) return;
  const Pending& p = it->second;
  int first = 0;
  while (first < size_ && !p.have[first]) ++first;
  if (first == size_) return;
  // Only allreduce and barrier continue while a rank has joined: any other op fails at once
  // for each rank that submits it (the ranks that have not submitted it yet may use another
  // name, e.g. an unnamed op's counter that the joined rank never advanced), never waits.
  const OpType op = p.by_rank[first].op;
  const bool fails_on_join = op != OpType::kAllreduce && op != OpType::kBarrier;
  if (!(fails_on_join && joined_count_ > 0)) {
    for (int r = 0; r < size_; ++r)
      if (!p.have[r] && !joined_[r]) return;
  }
  Request sample = p.by_rank[first];
  Response response = build(name, p);
  if (response.type == ResponseType::kError) noteFailedGroups(p, response.error_message);
  table_.erase(it);
  emit(std::move(response), sample);
}

void Coordinator::emit(Response response, const Request& sample) {
  if (sample.group.empty() || sample.group_size <= 1) {
    ready_.push_back(std::move(response));
    return;
  }
  auto& members = groups_[sample.group];
  members.push_back(std::move(response));
  if (static_cast<int>(members.size()) < sample.group_size) return;
  for (auto& r : members) ready_.push_back(std::move(r));
  groups_.erase(sample.group);
}

Response Coordinator::build(const std::string& name, const Pending& p) const {
  Response r;
  r.names = {name};
  int first = 0;
  while (!p.have[first]) ++first;
  const Request& a = p.by_rank[first];
  r.op = a.op;
  r.dtype = a.dtype;
  r.reduce_op = a.reduce_op;
  r.device = a.device;
  r.root = a.root;
  r.prescale = a.prescale;
  r.postscale = a.postscale;
  auto fail = [&](StatusCode code, const std::string& message) {
    r.type = ResponseType::kError;
    r.error_code = code;
    r.error_message = message;
    return r;
  };
  // Counts from other ranks are checked again here: a size that overflows must become an
  // error on every rank's handle, never a buffer computed from it.
  for (int rank = first; rank < size_; ++rank) {
    if (!p.have[rank]) continue;
    try {
      validateRequest(p.by_rank[rank], size_);
    } catch (const Error& e) {
      return fail(StatusCode::kInvalidArgument, std::string(e.what()) + " (request of rank " +
                                                    std::to_string(rank) + ")");
    }
  }
  for (int rank = first + 1; rank < size_; ++rank) {
    if (!p.have[rank]) continue;
    std::string mismatch = firstMismatch(a, first, p.by_rank[rank], rank);
    if (!mismatch.empty()) return fail(StatusCode::kMismatch, mismatch);
  }
  std::vector<int> joined;
  for (int rank = 0; rank < size_; ++rank)
    if (joined_[rank] && !p.have[rank]) joined.push_back(rank);
  if (joined.empty() && joined_count_ > 0 && a.op != OpType::kAllreduce &&
      a.op != OpType::kBarrier) {
    for (int rank = 0; rank < size_; ++rank)
      if (joined_[rank]) joined.push_back(rank);
  }
  if (!joined.empty() && a.op != OpType::kAllreduce && a.op != OpType::kBarrier)
    return fail(StatusCode::kJoined,
                describe(a) + ": not allowed while rank(s) " + joinInts(joined) +
                    " have joined (only allreduce and barrier continue after join)");
  switch (a.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
    case OpType::kBroadcast:
      r.counts = {shapeElements(a.shape)};
      break;
    case OpType::kAllgather: {
      r.first_dims.resize(size_);
      for (int rank = 0; rank < size_; ++rank) r.first_dims[rank] = p.by_rank[rank].shape[0];
      std::string too_large = outputTooLarge(a, r.first_dims);
      if (!too_large.empty()) return fail(StatusCode::kInvalidArgument, too_large);
      break;
    }
    case OpType::kAlltoall:
      r.splits.reserve(static_cast<size_t>(size_) * size_);
      for (int rank = 0; rank < size_; ++rank) {
        const Request& q = p.by_rank[rank];
        r.splits.insert(r.splits.end(), q.splits.begin(), q.splits.end());
      }
      for (int to = 0; to < size_; ++to) {  // what rank `to` receives from each rank
        std::vector<int64_t> rows(size_);
        for (int from = 0; from < size_; ++from)
          rows[from] = r.splits[static_cast<size_t>(from) * size_ + to];
        std::string too_large = outputTooLarge(a, rows);
        if (!too_large.empty())
          return fail(StatusCode::kInvalidArgument, too_large + " on rank " + std::to_string(to));
      }
      break;
    case OpType::kAddProcessSet:
      r.splits = a.splits;
      break;
    case OpType::kRemoveProcessSet:
      r.value = a.root;
      break;
    case OpType::kBarrier:
    case OpType::kJoin:
      break;
  }
  return r;
}

std::vector<Response> Coordinator::takeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

std::vector<StallInfo> Coordinator::stalled(Clock::time_point now, double seconds) const {
  std::vector<StallInfo> out;
  for (const auto& kv : table_) {
    double waited = std::chrono::duration<double>(now - kv.second.first_seen).count();
    if (waited < seconds) continue;
    StallInfo info;
    info.name = kv.first;
    info.waited_seconds = waited;
    for (int r = 0; r < size_; ++r) {
      if (kv.second.have[r]) info.op = kv.second.by_rank[r].op;
      if (!kv.second.have[r] && !joined_[r]) info.missing_ranks.push_back(r);
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tutti
