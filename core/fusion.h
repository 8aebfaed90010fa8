// Tensor fusion. planFusion is pure: the same input list gives the same plan on every rank.
// FusionBuffer is the persistent host buffer that fused tensors are packed into.
#pragma once

#include "core/message.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tutti {

// Merges allreduce responses that share dtype, reduce op, scale factors and device into
// one response whose names/counts are concatenated, as long as the fused bytes stay within
// `threshold`. A fused response takes the place of its first member; the others keep their
// relative order. CUDA tensors and errors are never fused.
std::vector<Response> planFusion(std::vector<Response> responses, int64_t threshold);
// The same plan from responses held elsewhere (the response cache): each is copied once,
// into its batch.
std::vector<Response> planFusion(const std::vector<const Response*>& responses,
                                 int64_t threshold);

// The bytes of data `r` moves on this rank (group rank `rank` of `size`), known from the
// agreed response alone but for `row_elements`: the elements per first-dimension row of
// this rank's tensor (allgather, alltoall; the trailing dimensions agree on every rank).
// allreduce: every tensor; broadcast, reducescatter: the input; allgather: the gathered
// output; alltoall: what it sends or receives, whichever is more. 0 for an error response,
// barrier, join and set changes; INT64_MAX when it does not fit.
int64_t responseBytes(const Response& r, int rank, int size, int64_t row_elements);

// Grows on demand and never shrinks: fresh pages are slow here, so the buffer is reused.
class FusionBuffer {
 public:
  void* reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace tutti
