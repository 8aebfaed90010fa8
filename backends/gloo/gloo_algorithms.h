// Collectives built on GlooGroup::exchange() (point-to-point over gloo's TCP pairs), so that
// every byte moves through buffers abort() can wake, zero-length pieces are skipped on both
// sides, and errors name the peers being waited for. Called from one thread per group.
#pragma once

#include "backends/gloo/gloo_group.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tutti {
namespace detail {

// acc[i] = acc[i] (op) in[i] for i < count elements.
using ReduceFunction = std::function<void(void* acc, const void* in, size_t count)>;

// In place over `data` (count elements of `element` bytes):
//  1. split into size() chunks (the first count % size one element longer);
//  2. reduce-scatter: in step s (0 <= s < n-1) send chunk (rank - s) to the right neighbour,
//     receive chunk (rank - s - 1) from the left one into `scratch` and reduce it in, so
//     after n-1 steps this rank holds the full reduction of chunk (rank + 1);
//  3. allgather: in step s send chunk (rank + 1 - s) right, receive chunk (rank - s) from
//     the left, in place.
// Every rank applies the same reductions in the same order, so results are identical.
// `scratch` is the caller's persistent buffer; it grows to one chunk.
void ringAllreduce(GlooGroup& group, void* data, int64_t count, size_t element,
                   const ReduceFunction& reduce, std::vector<char>& scratch,
                   const std::string& what, Deadline deadline);

// `out` holds bytes[r] bytes of member r in rank order, this rank's block already in place.
// Ring: in step s send block (rank - s) right, receive block (rank - s - 1) from the left.
void ringAllgatherv(GlooGroup& group, void* out, const std::vector<size_t>& bytes,
                    const std::string& what, Deadline deadline);

// Binomial tree from `root` (a group rank): log2(n) rounds.
void treeBroadcast(GlooGroup& group, void* buf, size_t bytes, int root,
                   const std::string& what, Deadline deadline);

// Dissemination barrier: in round k send a token to rank + 2^k, receive from rank - 2^k.
void disseminationBarrier(GlooGroup& group, const std::string& what, Deadline deadline);

}  // namespace detail
}  // namespace tutti
