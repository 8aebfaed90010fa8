// Checks of one rank's own input, done when it is submitted (before any negotiation):
// null buffers, negative dimensions, roots and splits outside the process set, reduce
// ops that make no sense for the dtype. Throws Error(kInvalidArgument) naming the op, the
// tensor, what was expected and what was given.
#pragma once

#include "core/tensor_queue.h"

namespace tutti {

// May complete e.request (alltoall's equal splits).
void validateEntry(TensorEntry& e, int set_size);

}  // namespace tutti
