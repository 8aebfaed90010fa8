#include "backends/gloo/gloo_algorithms.h"

#include <algorithm>
#include <numeric>

namespace tutti {
namespace detail {
namespace {

constexpr uint32_t kReduceScatterTag = 10;
constexpr uint32_t kAllgatherTag = 11;
constexpr uint32_t kAllgathervTag = 12;
constexpr uint32_t kBroadcastTag = 13;
constexpr uint32_t kBarrierTag = 14;
// Reduce-scatter moves a chunk as segments of at most this size, reducing each one while
// the next ones are still arriving.
constexpr size_t kSegmentBytes = 256 << 10;

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

void ringAllreduce(GlooGroup& group, void* data, int64_t count, size_t element,
                   const ReduceFunction& reduce, std::vector<char>& scratch,
                   const std::string& what, Deadline deadline) {
  const int n = group.size(), r = group.rank();
  if (count == 0 || n == 1) return;
  const int right = (r + 1) % n, left = mod(r - 1, n);
  std::vector<size_t> offset(n), bytes(n);
  int64_t at = 0;
  for (int c = 0; c < n; ++c) {
    const int64_t len = count / n + (c < count % n ? 1 : 0);
    offset[c] = static_cast<size_t>(at) * element;
    bytes[c] = static_cast<size_t>(len) * element;
    at += len;
  }
  if (scratch.size() < bytes[0]) scratch.resize(bytes[0]);
  const size_t total = static_cast<size_t>(count) * element;
  char* base = static_cast<char*>(data);
  const size_t segment = std::max(element, kSegmentBytes / element * element);
  std::vector<GlooGroup::Transfer> sends, recvs;
  auto split = [&](int peer, size_t at, size_t len, std::vector<GlooGroup::Transfer>& out) {
    out.clear();
    for (size_t done = 0; done < len; done += segment)
      out.push_back({peer, at + done, std::min(segment, len - done)});
  };
  for (int s = 0; s < n - 1; ++s) {
    const int send = mod(r - s, n), recv = mod(r - s - 1, n);
    split(right, offset[send], bytes[send], sends);
    split(left, 0, bytes[recv], recvs);
    group.exchange(what + " (reduce-scatter step " + std::to_string(s) + ")", data, total,
                   sends, scratch.data(), bytes[recv], recvs, kReduceScatterTag, deadline,
                   [&](size_t i) {
                     reduce(base + offset[recv] + recvs[i].offset, scratch.data() +
                            recvs[i].offset, recvs[i].bytes / element);
                   });
  }
  for (int s = 0; s < n - 1; ++s) {
    const int send = mod(r + 1 - s, n), recv = mod(r - s, n);
    group.exchange(what + " (allgather step " + std::to_string(s) + ")", data, total,
                   {{right, offset[send], bytes[send]}}, data, total,
                   {{left, offset[recv], bytes[recv]}}, kAllgatherTag, deadline);
  }
}

void ringAllgatherv(GlooGroup& group, void* out, const std::vector<size_t>& bytes,
                    const std::string& what, Deadline deadline) {
  const int n = group.size(), r = group.rank();
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  if (total == 0 || n == 1) return;
  std::vector<size_t> offset(n, 0);
  for (int c = 1; c < n; ++c) offset[c] = offset[c - 1] + bytes[c - 1];
  const int right = (r + 1) % n, left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    const int send = mod(r - s, n), recv = mod(r - s - 1, n);
    group.exchange(what + " (step " + std::to_string(s) + ")", out, total,
                   {{right, offset[send], bytes[send]}}, out, total,
                   {{left, offset[recv], bytes[recv]}}, kAllgathervTag, deadline);
  }
}

void treeBroadcast(GlooGroup& group, void* buf, size_t bytes, int root,
                   const std::string& what, Deadline deadline) {
  const int n = group.size();
  if (bytes == 0 || n == 1) return;
  const int me = mod(group.rank() - root, n);  // rank relative to the root
  int mask = 1;
  while (mask < n && me >= mask) mask <<= 1;
  // 1. Receive from the parent (relative rank me - highest bit of me).
  if (me != 0) {
    const int parent = mod(me - (mask >> 1) + root, n);
    group.exchange(what + " (from parent)", nullptr, 0, {}, buf, bytes, {{parent, 0, bytes}},
                   kBroadcastTag, deadline);
  }
  // 2. Send to the children me + mask, me + 2 mask, ... below n.
  std::vector<GlooGroup::Transfer> children;
  for (int m = mask; me + m < n; m <<= 1) children.push_back({mod(me + m + root, n), 0, bytes});
  if (!children.empty())
    group.exchange(what + " (to children)", buf, bytes, children, nullptr, 0, {},
                   kBroadcastTag, deadline);
}

void disseminationBarrier(GlooGroup& group, const std::string& what, Deadline deadline) {
  const int n = group.size(), r = group.rank();
  char token_out = 1, token_in = 0;
  for (int k = 1; k < n; k <<= 1) {
    group.exchange(what + " (round " + std::to_string(k) + ")", &token_out, 1,
                   {{(r + k) % n, 0, 1}}, &token_in, 1, {{mod(r - k, n), 0, 1}}, kBarrierTag,
                   deadline);
  }
}

}  // namespace detail
}  // namespace tutti
