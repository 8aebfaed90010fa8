#include "core/executor.h"

#include "base/reduce.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace tutti {
namespace {

int64_t rowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// The op's output memory, from the caller's allocator or malloc.
void* allocateOutput(TensorEntry& e, const std::vector<int64_t>& shape, int64_t nbytes) {
  void* out = e.allocator ? e.allocator(shape) : std::malloc(nbytes > 0 ? nbytes : 1);
  if (out == nullptr && nbytes > 0)
    throwError(StatusCode::kInternal, std::string(opTypeName(e.request.op)) + " '" +
                                          e.request.name + "': cannot allocate " +
                                          std::to_string(nbytes) + " bytes for the output");
  e.handle->result.data = out;
  e.handle->from_allocator = static_cast<bool>(e.allocator);
  e.handle->result.nbytes = nbytes;
  e.handle->result.shape = shape;
  return out;
}

// The scaling of a reduction as the backends take it: an average is a sum divided by the
// set's size.
ReduceScaling scalingOf(const Response& r, int set_size) {
  ReduceScaling scaling;
  scaling.prescale = r.prescale;
  scaling.postscale = r.postscale;
  scaling.divisor = r.reduce_op == ReduceOp::kAverage ? set_size : 1;
  return scaling;
}

ReduceOp backendOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

}  // namespace

Backend* Executor::pick(ProcessSet& set, OpType op, DataType dtype, DeviceType device) const {
  for (auto& b : set.backends)
    if (b->supports(op, dtype, device)) return b.get();
  return nullptr;
}

void Executor::run(const Response& r, ProcessSet& set, Timeline* timeline) {
  timeline_ = timeline;
  current_ = &r;
  set_id_ = set.id;
  if (timeline_) {
    const std::string args = "\"tensors\":" + std::to_string(r.names.size());
    const char* what = r.type == ResponseType::kError ? "ERROR" : opPhaseName(r.op);
    for (const auto& name : r.names) {
      timeline_->end(set.id, r.op, name);  // WAIT_FOR_BATCH
      timeline_->begin(set.id, r.op, name, what, args);
    }
  }
  struct Done {  // the rows' open phases end and the waiters wake however the op ends
    Executor* self;
    ~Done() {
      if (self->handles_) self->handles_->wake();  // once for the whole batch
      self->handles_ = nullptr;
      if (self->timeline_)
        for (const auto& name : self->current_->names)
          self->timeline_->endAll(self->set_id_, self->current_->op, name);
      self->timeline_ = nullptr;
      self->current_ = nullptr;
    }
  } done{this};
  if (r.type == ResponseType::kError) stats_.addError();
  try {
    execute(r, set);
  } catch (const Error& e) {
    // A failed op is fatal: say which op, tensors, set and peers, unless the message does.
    const std::string what = std::string(opTypeName(r.op)) + " " + quotedName(r.names[0]);
    std::string message = e.what();
    if (message.find(quotedName(r.names[0])) == std::string::npos) {
      std::string tensors = r.names.size() > 1
                                ? " (fused with " + std::to_string(r.names.size() - 1) + " more)"
                                : "";
      message = what + tensors + " on process set " + std::to_string(set.id) + " (ranks " +
                joinInts(set.ranks) + "): " + message;
    }
    throwError(e.code(), message);
  }
}

void Executor::phase(const char* name, const std::string& args) {
  if (!timeline_) return;
  for (const auto& n : current_->names) timeline_->begin(set_id_, current_->op, n, name, args);
}

void Executor::phaseEnd() {
  if (!timeline_) return;
  for (const auto& n : current_->names) timeline_->end(set_id_, current_->op, n);
}

template <typename Call>
void Executor::callBackend(Backend& b, int64_t tensors, int64_t bytes, Call&& call) {
  if (timeline_) {
    std::string name = b.name();
    for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    name += std::string("_") + opPhaseName(current_->op);
    phase(name.c_str(), "\"backend\":\"" + std::string(b.name()) + "\",\"algorithm\":\"" +
                            b.algorithm(current_->op, bytes) +
                            "\",\"bytes\":" + std::to_string(bytes));
  }
  const auto start = Clock::now();
  call();
  stats_.addTime(StatTime::kBackend, Clock::now() - start);
  stats_.addOp(current_->op, b.name(), tensors, bytes);
  phaseEnd();
}

template <typename Work>
void Executor::timed(StatTime what, const char* name, Work&& work) {
  phase(name);
  const auto start = Clock::now();
  work();
  stats_.addTime(what, Clock::now() - start);
  phaseEnd();
}

void Executor::complete(TensorEntry& e, const Status& status) {
  if (timeline_) timeline_->begin(set_id_, current_->op, e.request.name, "CALLBACK");
  HandleTable::complete(*e.handle, status, /*wake=*/false);  // run() wakes the waiters
  handles_ = e.handle->owner;
  if (timeline_) timeline_->end(set_id_, current_->op, e.request.name);
}

void Executor::execute(const Response& r, ProcessSet& set) {
  // The batch's entries, in a vector kept between responses: a step's worth of entries is
  // tens of KiB, and allocating and freeing that every round costs malloc a consolidation.
  std::vector<TensorQueue::Taken>& entries = batch_;
  struct Recycle {  // the entries' allocators and handles go when the op ends, their
    TensorQueue& queue;  // storage back to the queue for the next entries
    std::vector<TensorQueue::Taken>& entries;
    ~Recycle() { queue.recycle(&entries); }
  } recycle{set.queue, entries};
  // An error completes the entries this rank held when it was agreed (claimed then), not
  // one of the same name submitted since.
  set.queue.take(r.names, &entries, r.type == ResponseType::kError);

  if (r.type == ResponseType::kError) {
    for (auto& e : entries)
      if (e) complete(*e, Status(r.error_code, r.error_message));
    return;
  }
  if (r.op == OpType::kBarrier || r.op == OpType::kJoin) {
    for (auto& e : entries) {
      if (!e) continue;
      e->handle->result.last_joined_rank = r.value;
      complete(*e);
    }
    return;
  }
  Backend* backend = pick(set, r.op, r.dtype, r.device);
  if (backend == nullptr) {
    std::string message = std::string(opTypeName(r.op)) + " '" + r.names[0] + "': no backend of this build supports " +
                          opTypeName(r.op) + " of " + dataTypeName(r.dtype) + " tensors on " +
                          deviceTypeName(r.device);
    for (auto& e : entries)
      if (e) complete(*e, Status(StatusCode::kUnsupported, message));
    return;
  }
  // Device memory is scaled by the backend or not at all: a reduction it cannot scale
  // fails as an op on every rank (each decides from the same response), not as the job.
  if (r.device != DeviceType::kCpu &&
      (r.op == OpType::kAllreduce || r.op == OpType::kReducescatter)) {
    const ReduceScaling scaling = scalingOf(r, set.size());
    std::string why = scaling.trivial()
                          ? std::string()
                          : backend->scalingRefusal(r.dtype, backendOp(r.reduce_op), scaling);
    if (!why.empty()) {
      for (auto& e : entries)
        if (e) complete(*e, Status(StatusCode::kUnsupported,
                                   std::string(opTypeName(r.op)) + " '" + r.names[0] + "': " + why));
      return;
    }
  }
  if (r.op == OpType::kAllreduce) return allreduce(r, set, *backend, entries);

  if (!entries[0])
    throwError(StatusCode::kInternal, std::string(opTypeName(r.op)) + " '" + r.names[0] +
                                          "' was agreed but this rank holds no such tensor");
  TensorEntry& e = *entries[0];
  Deadline deadline = deadlineAfter(config_.timeout_seconds);
  switch (r.op) {
    case OpType::kBroadcast:
      callBackend(*backend, 1, r.counts[0] * dataTypeSize(r.dtype), [&] {
        backend->broadcast(e.output, r.counts[0], r.dtype, r.root, deadline);
      });
      break;
    case OpType::kAllgather: allgather(r, set, *backend, e); break;
    case OpType::kAlltoall: alltoall(r, set, *backend, e); break;
    case OpType::kReducescatter: reducescatter(r, set, *backend, e); break;
    default:
      throwError(StatusCode::kInternal, std::string("executor: unexpected op ") + opTypeName(r.op));
  }
  complete(e);
}

void Executor::allreduce(const Response& r, ProcessSet& set, Backend& b,
                         std::vector<TensorQueue::Taken>& entries) {
  const DataType dtype = r.dtype;
  const int64_t esize = dataTypeSize(dtype);
  const ReduceOp op = backendOp(r.reduce_op);
  // Average: the sum divided by the set size (a division, not a multiplication by 1/size,
  // so that it is correctly rounded), then times postscale.
  const double post = r.postscale;
  const int64_t divisor = r.reduce_op == ReduceOp::kAverage ? set.size() : 1;
  const bool on_host = r.device == DeviceType::kCpu;
  Deadline deadline = deadlineAfter(config_.timeout_seconds);

  if (!on_host && entries.size() == 1 && entries[0]) {  // device memory: the backend scales
    TensorEntry& e = *entries[0];
    callBackend(b, 1, r.counts[0] * esize, [&] {
      b.allreduceScaled(e.input, e.output, r.counts[0], dtype, op, scalingOf(r, set.size()),
                        deadline);
    });
    complete(e);
    return;
  }
  if (entries.size() == 1 && entries[0]) {  // one tensor: reduce straight into its output
    TensorEntry& e = *entries[0];
    const void* in = e.input;
    if (r.prescale != 1.0) {
      timed(StatTime::kPack, "PACK", [&] { scaleInto(in, e.output, r.counts[0], dtype, r.prescale); });
      in = e.output;
    }
    callBackend(b, 1, r.counts[0] * esize,
                [&] { b.allreduce(in, e.output, r.counts[0], dtype, op, deadline); });
    if (divisor != 1 || post != 1.0)
      timed(StatTime::kUnpack, "UNPACK", [&] {
        divideInto(e.output, r.counts[0], dtype, divisor);
        if (post != 1.0) scaleInto(e.output, e.output, r.counts[0], dtype, post);
      });
    complete(e);
    return;
  }
  if (!on_host)
    throwError(StatusCode::kInternal, "allreduce '" + r.names[0] + "': CUDA tensors are never fused");
  int64_t total = 0;
  for (int64_t c : r.counts) total += c;
  if (entries.size() > 1) stats_.addFusedBatch(static_cast<int64_t>(entries.size()), total * esize);
  if (set.size() == 1 && std::all_of(entries.begin(), entries.end(), [](const auto& e) { return bool(e); }) &&
      piecesFor(r, entries)) {
    // One rank with all of its tensors: its contribution is the result. Each tensor goes to
    // its output (in place: nothing to move) and is scaled there, without the fusion
    // buffer's copy in and out.
    callBackend(b, static_cast<int64_t>(entries.size()), total * esize, [&] {
      for (size_t i = 0; i < entries.size(); ++i)
        scaleInto(entries[i]->input, entries[i]->output, r.counts[i], dtype, r.prescale);
    });
    if (post != 1.0)  // the divisor is 1
      timed(StatTime::kUnpack, "UNPACK", [&] {
        for (size_t i = 0; i < entries.size(); ++i)
          scaleInto(entries[i]->output, entries[i]->output, r.counts[i], dtype, post);
      });
    for (auto& e : entries) complete(*e);
    return;
  }
  if (r.prescale == 1.0 && b.allreducesPieces() && piecesFor(r, entries)) {
    callBackend(b, static_cast<int64_t>(entries.size()), total * esize,
                [&] { b.allreducePieces(pieces_, total, dtype, op, deadline); });
    if (divisor != 1 || post != 1.0)
      timed(StatTime::kUnpack, "UNPACK", [&] {
        for (size_t i = 0; i < entries.size(); ++i) {
          if (!entries[i]) continue;
          divideInto(entries[i]->output, r.counts[i], dtype, divisor);
          scaleInto(entries[i]->output, entries[i]->output, r.counts[i], dtype, post);
        }
      });
    for (auto& e : entries)
      if (e) complete(*e);
    return;
  }
  char* buf = static_cast<char*>(fusion_.reserve(static_cast<size_t>(total * esize)));
  timed(StatTime::kPack, "PACK", [&] {
    int64_t offset = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      char* dst = buf + offset * esize;
      if (entries[i])
        scaleInto(entries[i]->input, dst, r.counts[i], dtype, r.prescale);
      else  // joined: this rank contributes zeros
        std::memset(dst, 0, static_cast<size_t>(r.counts[i] * esize));
      offset += r.counts[i];
    }
  });
  callBackend(b, static_cast<int64_t>(entries.size()), total * esize,
              [&] { b.allreduce(buf, buf, total, dtype, op, deadline); });
  timed(StatTime::kUnpack, "UNPACK", [&] {
    int64_t offset = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i]) {
        divideInto(buf + offset * esize, r.counts[i], dtype, divisor);
        scaleInto(buf + offset * esize, entries[i]->output, r.counts[i], dtype, post);
      }
      offset += r.counts[i];
    }
  });
  for (auto& e : entries)
    if (e) complete(*e);
}

bool Executor::piecesFor(const Response& r,
                         const std::vector<TensorQueue::Taken>& entries) {
  const int64_t esize = dataTypeSize(r.dtype);
  pieces_.resize(entries.size());
  spans_.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    AllreducePiece& p = pieces_[i];
    p = AllreducePiece{nullptr, nullptr, r.counts[i]};
    if (!entries[i] || r.counts[i] == 0) continue;
    p.in = entries[i]->input;
    p.out = entries[i]->output;
    const auto bytes = static_cast<uintptr_t>(r.counts[i] * esize);
    const auto in = reinterpret_cast<uintptr_t>(p.in), out = reinterpret_cast<uintptr_t>(p.out);
    if (in == out) {
      spans_.push_back({out, out + bytes, i, true});
    } else {
      spans_.push_back({in, in + bytes, i, false});
      spans_.push_back({out, out + bytes, i, true});
    }
  }
  // Sorted by start, a span that overlaps any earlier one overlaps the one reaching furthest;
  // a conflict is an overlap in which something is written (reads may share memory).
  std::sort(spans_.begin(), spans_.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* furthest = nullptr;
  for (const Span& s : spans_) {
    if (furthest != nullptr && s.begin < furthest->end && (s.written || furthest->written))
      return false;
    if (furthest == nullptr || s.end > furthest->end) furthest = &s;
  }
  return true;
}

void Executor::allgather(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e) {
  const auto& shape = e.request.shape;
  const int64_t row = rowElements(shape);
  std::vector<int64_t> counts(set.size());
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = 0;
  for (int i = 0; i < set.size(); ++i) {
    counts[i] = r.first_dims[i] * row;
    out_shape[0] += r.first_dims[i];
  }
  void* out = allocateOutput(e, out_shape, shapeElements(out_shape) * dataTypeSize(r.dtype));
  callBackend(b, 1, counts[set.rank] * dataTypeSize(r.dtype), [&] {
    b.allgatherv(e.input, out, counts, r.dtype, deadlineAfter(config_.timeout_seconds));
  });
}

void Executor::alltoall(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e) {
  const int n = set.size(), me = set.rank;
  const int64_t row = rowElements(e.request.shape);
  std::vector<int64_t> send(n), recv(n), recv_splits(n);
  std::vector<int64_t> out_shape = e.request.shape;
  out_shape[0] = 0;
  for (int j = 0; j < n; ++j) {
    send[j] = r.splits[static_cast<size_t>(me) * n + j] * row;
    recv_splits[j] = r.splits[static_cast<size_t>(j) * n + me];
    recv[j] = recv_splits[j] * row;
    out_shape[0] += recv_splits[j];
  }
  void* out = allocateOutput(e, out_shape, shapeElements(out_shape) * dataTypeSize(r.dtype));
  e.handle->result.recv_splits = recv_splits;
  callBackend(b, 1, shapeElements(e.request.shape) * dataTypeSize(r.dtype), [&] {
    b.alltoallv(e.input, send, out, recv, r.dtype, deadlineAfter(config_.timeout_seconds));
  });
}

void Executor::reducescatter(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e) {
  const int n = set.size();
  const auto& shape = e.request.shape;
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t row = rowElements(shape);
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = (rows / n + (i < rows % n ? 1 : 0)) * row;
  std::vector<int64_t> out_shape = shape.empty() ? std::vector<int64_t>{1} : shape;
  out_shape[0] = rows / n + (set.rank < rows % n ? 1 : 0);
  const int64_t esize = dataTypeSize(r.dtype);
  void* out = allocateOutput(e, out_shape, counts[set.rank] * esize);
  const ReduceOp op = backendOp(r.reduce_op);
  if (r.device != DeviceType::kCpu) {  // device memory: the backend scales
    callBackend(b, 1, r.counts[0] * esize, [&] {
      b.reducescatterScaled(e.input, out, counts, r.dtype, op, scalingOf(r, n),
                            deadlineAfter(config_.timeout_seconds));
    });
    return;
  }
  const void* in = e.input;
  if (r.prescale != 1.0) {
    void* scaled = fusion_.reserve(static_cast<size_t>(r.counts[0] * esize));
    timed(StatTime::kPack, "PACK", [&] { scaleInto(in, scaled, r.counts[0], r.dtype, r.prescale); });
    in = scaled;
  }
  callBackend(b, 1, r.counts[0] * esize, [&] {
    b.reducescatter(in, out, counts, r.dtype, op, deadlineAfter(config_.timeout_seconds));
  });
  if (r.reduce_op == ReduceOp::kAverage || r.postscale != 1.0)
    timed(StatTime::kUnpack, "UNPACK", [&] {
      if (r.reduce_op == ReduceOp::kAverage) divideInto(out, counts[set.rank], r.dtype, n);
      if (r.postscale != 1.0) scaleInto(out, out, counts[set.rank], r.dtype, r.postscale);
    });
}

}  // namespace tutti
