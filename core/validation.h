// Checks of one rank's own input, done when it is submitted (before any negotiation):
// null buffers, negative dimensions, sizes that overflow, too many dimensions, roots and
// splits outside the process set, reduce ops that make no sense for the dtype. Throws
// Error(kInvalidArgument) naming the op, the tensor, what was expected and what was given.
// The coordinator runs validateRequest again on every request it receives, so a count that
// comes from another rank is never trusted.
#pragma once

#include "core/tensor_queue.h"

namespace tutti {

// The checks that need only the request (no buffers). Control ops (barrier, join, process
// set changes) pass.
void validateRequest(const Request& q, int set_size);

// validateRequest plus the buffers. May complete e.request (alltoall's equal splits).
void validateEntry(TensorEntry& e, int set_size);

}  // namespace tutti
