#include "core/fusion.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace tutti {
namespace {

bool fusible(const Response& r) {
  return r.type == ResponseType::kOp && r.op == OpType::kAllreduce &&
         r.device == DeviceType::kCpu;
}

bool sameKind(const Response& a, const Response& b) {
  return a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.device == b.device;
}

// The response's bytes, or -1 when they do not fit int64 (never fused then).
int64_t bytesOf(const Response& r) {
  int64_t n = 0;
  for (int64_t c : r.counts)
    if (c < 0 || !checkedAdd(n, c, &n)) return -1;
  return checkedMul(n, dataTypeSize(r.dtype), &n) ? n : -1;
}

// sum(v) * factor, or INT64_MAX when it does not fit (or a term is negative).
int64_t scaledSum(const std::vector<int64_t>& v, int64_t factor) {
  int64_t n = 0;
  for (int64_t x : v)
    if (x < 0 || !checkedAdd(n, x, &n)) return INT64_MAX;
  return checkedMul(n, factor, &n) ? n : INT64_MAX;
}

}  // namespace

int64_t responseBytes(const Response& r, int rank, int size, int64_t row_elements) {
  if (r.type == ResponseType::kError) return 0;
  const int64_t esize = dataTypeSize(r.dtype);
  switch (r.op) {
    case OpType::kAllreduce:
      return scaledSum(r.counts, esize);
    case OpType::kBroadcast:
    case OpType::kReducescatter:
      return r.counts.empty() ? 0 : scaledSum({r.counts[0]}, esize);
    case OpType::kAllgather: {
      int64_t row_bytes = 0;
      if (!checkedMul(std::max<int64_t>(row_elements, 0), esize, &row_bytes)) return INT64_MAX;
      return scaledSum(r.first_dims, row_bytes);
    }
    case OpType::kAlltoall: {
      int64_t row_bytes = 0;
      if (!checkedMul(std::max<int64_t>(row_elements, 0), esize, &row_bytes)) return INT64_MAX;
      const size_t n = static_cast<size_t>(std::max(size, 0));
      if (rank < 0 || rank >= size || r.splits.size() != n * n) return 0;
      std::vector<int64_t> sent(n), received(n);
      for (size_t j = 0; j < n; ++j) {
        sent[j] = r.splits[static_cast<size_t>(rank) * n + j];
        received[j] = r.splits[j * n + static_cast<size_t>(rank)];
      }
      return std::max(scaledSum(sent, row_bytes), scaledSum(received, row_bytes));
    }
    default:
      return 0;
  }
}

std::vector<Response> planFusion(std::vector<Response> responses, int64_t threshold) {
  std::vector<Response> out;
  out.reserve(responses.size());
  std::vector<bool> used(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (used[i]) continue;
    used[i] = true;
    Response fused = std::move(responses[i]);
    int64_t bytes = fusible(fused) ? bytesOf(fused) : -1;
    if (bytes >= 0) {
      for (size_t j = i + 1; j < responses.size() && bytes < threshold; ++j) {
        if (used[j] || !fusible(responses[j]) || !sameKind(fused, responses[j])) continue;
        int64_t more = bytesOf(responses[j]), sum = 0;
        if (more < 0 || !checkedAdd(bytes, more, &sum) || sum > threshold) continue;
        bytes = sum;
        used[j] = true;
        if (fused.names.size() == 1) {  // the first to join: room for all that may follow
          fused.names.reserve(responses.size() - i);
          fused.counts.reserve(responses.size() - i);
        }
        for (auto& name : responses[j].names) fused.names.push_back(std::move(name));
        fused.counts.insert(fused.counts.end(), responses[j].counts.begin(),
                            responses[j].counts.end());
      }
    }
    out.push_back(std::move(fused));
  }
  return out;
}

std::vector<Response> planFusion(const std::vector<const Response*>& responses,
                                 int64_t threshold) {
  std::vector<Response> out;
  out.reserve(responses.size());  // `fused` below stays valid
  std::vector<bool> used(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (used[i]) continue;
    used[i] = true;
    out.push_back(*responses[i]);
    Response& fused = out.back();
    int64_t bytes = fusible(fused) ? bytesOf(fused) : -1;
    if (bytes < 0) continue;
    for (size_t j = i + 1; j < responses.size() && bytes < threshold; ++j) {
      const Response& r = *responses[j];
      if (used[j] || !fusible(r) || !sameKind(fused, r)) continue;
      int64_t more = bytesOf(r), sum = 0;
      if (more < 0 || !checkedAdd(bytes, more, &sum) || sum > threshold) continue;
      bytes = sum;
      used[j] = true;
      if (fused.names.size() == 1) {  // the first to join: room for all that may follow
        fused.names.reserve(responses.size() - i);
        fused.counts.reserve(responses.size() - i);
      }
      fused.names.insert(fused.names.end(), r.names.begin(), r.names.end());
      fused.counts.insert(fused.counts.end(), r.counts.begin(), r.counts.end());
    }
  }
  return out;
}

void FusionBuffer::Free::operator()(void* p) const { std::free(p); }

void* FusionBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_.get();
  if (bytes > static_cast<size_t>(kMaxTensorBytes))
    throwError(StatusCode::kInternal, "fusion buffer: " + std::to_string(bytes) +
                                          " bytes requested, more than any tensor may have");
  size_t want = bytes < 64 ? 64 : bytes;
  want = (want + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, want);
  if (p == nullptr) throwError(StatusCode::kInternal, "fusion buffer: cannot allocate " + std::to_string(want) + " bytes");
  data_.reset(p);
  capacity_ = want;
  return p;
}

}  // namespace tutti
