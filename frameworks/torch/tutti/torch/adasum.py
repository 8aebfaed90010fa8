"""The Adasum reduction (op=hvd.Adasum) over tutti.torch's alltoall.

Adasum combines two gradients a and b into
    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
(a coefficient stays 1 where that norm squared is below sqrt(DBL_MIN)), and a power-of-two
number of ranks pairwise, as a binary tree over the ranks in order: ranks 2k and 2k+1
first, then the pairs {0,1} and {2,3}, and so on; the lower half is always `a`. This is
Horovod's definition; like Horovod, other world sizes are refused (NotImplementedError).

Each level exchanges the whole vector with the partner rank (rank ^ level) in one alltoall
that sends to that rank only, and both partners combine the same two vectors in the same
order in float64, so after log2(size) levels every rank holds the same result. Horovod
splits the vector instead (vector halving, distance doubling) and rounds to the tensor's
dtype after each level; the two agree to that dtype's rounding. Tensors: float16, bfloat16,
float32, float64, on CPU or CUDA (reduced through host memory). The reduction runs when it
is called (its handle is complete at once).
"""

import torch

from tutti.torch import mpi_ops
from tutti.torch.basics import _process_set_id, rank, size

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SQRT_DBL_MIN = 2.2250738585072014e-308 ** 0.5


def combine(a, b):
    """Adasum of two float64 vectors (a: the lower ranks' side)."""
    dot = float(torch.dot(a, b))
    a_norm_sq = float(torch.dot(a, a))
    b_norm_sq = float(torch.dot(b, b))
    a_coeff = 1.0 - 0.5 * dot / a_norm_sq if a_norm_sq >= _SQRT_DBL_MIN else 1.0
    b_coeff = 1.0 - 0.5 * dot / b_norm_sq if b_norm_sq >= _SQRT_DBL_MIN else 1.0
    return a_coeff * a + b_coeff * b


def check(tensor, name, process_set, what="allreduce"):
    """Raises what Horovod raises for an Adasum reduction it cannot do."""
    label = "%s %r" % (what, name) if name else what
    if tensor.dtype not in _DTYPES:
        raise ValueError("%s: Adasum reduces float16, bfloat16, float32 and float64 tensors, "
                         "got %s" % (label, tensor.dtype))
    if _process_set_id(process_set) != 0:
        raise NotImplementedError("%s: Adasum works on the global process set only (as in "
                                  "Horovod)" % label)
    world = size()
    if world & (world - 1):
        raise NotImplementedError("%s: Adasum needs a power-of-two number of ranks (as in "
                                  "Horovod), got %d" % (label, world))


def allreduce(tensor, name, prescale_factor, postscale_factor, process_set):
    """Returns the Adasum of every rank's `tensor` (a new tensor, same dtype and device):
    postscale_factor * Adasum(prescale_factor * tensor)."""
    name = mpi_ops._name(name) or mpi_ops._auto_name("allreduce.adasum", 0)
    check(tensor, name, process_set)
    world, me = size(), rank()
    vector = tensor.detach().to("cpu", torch.float64).reshape(-1) * float(prescale_factor)
    count = vector.numel()
    level = 1
    while level < world and count > 0:
        partner = me ^ level
        splits = [0] * world
        splits[partner] = count
        received, received_splits = mpi_ops.synchronize(mpi_ops.alltoall_async(
            vector, splits, "%s.adasum.%d" % (name, level), process_set))
        got = received_splits.tolist()
        if received.numel() != count or got[partner] != count:
            raise ValueError("allreduce %r (Adasum): %d elements on rank %d but rank %d sent "
                             "%d" % (name, count, me, partner, received.numel()))
        if me & level:
            vector = combine(received, vector)
        else:
            vector = combine(vector, received)
        level <<= 1
    vector = vector * float(postscale_factor)
    return vector.reshape(tensor.shape).to(tensor.device, tensor.dtype)
