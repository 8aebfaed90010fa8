"""Collectives as torch custom ops (torch.library, PyTorch 2.4 and later), for torch.compile.

Inside a function that torch.compile traces, hvd.allreduce and hvd.broadcast call these ops,
which the compiler keeps in its graph (no graph break) as opaque calls: "tutti::allreduce"
and "tutti::broadcast", each a complete (synchronous) collective that returns a new tensor,
with the same gradients as the eager ops. The other collectives (allgather, alltoall,
reducescatter, the grouped and in-place variants) make torch.compile break the graph and
run eagerly: results stay right. With older torch, or outside torch.compile, nothing here
is used.
"""

import torch

from tutti.torch import mpi_ops
from tutti.torch.basics import _registered, global_process_set, rank

AVAILABLE = hasattr(torch.library, "custom_op")


def eager(function):
    """Marks a collective that torch.compile must not trace into: the graph breaks there
    and the collective runs eagerly (instead of a warning about the extension's functions)."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None)
    return disable(function) if disable is not None else function


def compiling():
    """True while torch.compile (dynamo) traces the calling code."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def set_id(process_set):
    """The process set's id, read without calling into the extension (which torch.compile
    cannot trace); the op itself checks the set when it runs."""
    if process_set.process_set_id is None:
        raise ValueError("process set %s is not registered: call hvd.add_process_set() on "
                         "every rank first" % process_set)
    return process_set.process_set_id


def _process_set(set_id):
    return global_process_set if set_id == 0 else _registered[set_id]


def _grad_name(name):
    return name + ".grad" if name else ""


if AVAILABLE:
    @torch.library.custom_op("tutti::allreduce", mutates_args=())
    def allreduce(tensor: torch.Tensor, name: str, op: int, prescale_factor: float,
                  postscale_factor: float, process_set_id: int) -> torch.Tensor:
        return mpi_ops.synchronize(mpi_ops.allreduce_async(
            tensor, None, name or None, op, prescale_factor, postscale_factor,
            _process_set(process_set_id)))

    @allreduce.register_fake
    def _allreduce_fake(tensor, name, op, prescale_factor, postscale_factor,
                        process_set_id):
        return torch.empty_like(tensor)

    def _allreduce_setup(ctx, inputs, output):
        ctx.args = inputs[1:]

    def _allreduce_backward(ctx, grad):
        name, op, prescale, postscale, set_id = ctx.args
        return (allreduce(grad, _grad_name(name), op, prescale, postscale, set_id),
                None, None, None, None, None)

    allreduce.register_autograd(_allreduce_backward, setup_context=_allreduce_setup)

    @torch.library.custom_op("tutti::broadcast", mutates_args=())
    def broadcast(tensor: torch.Tensor, root_rank: int, name: str,
                  process_set_id: int) -> torch.Tensor:
        return mpi_ops.synchronize(mpi_ops.broadcast_async(
            tensor, root_rank, name or None, _process_set(process_set_id)))

    @broadcast.register_fake
    def _broadcast_fake(tensor, root_rank, name, process_set_id):
        return torch.empty_like(tensor)

    def _broadcast_setup(ctx, inputs, output):
        ctx.args = inputs[1:]

    def _broadcast_backward(ctx, grad):
        root_rank, name, set_id = ctx.args
        grad = allreduce(grad, _grad_name(name), mpi_ops.Average, 1.0, 1.0, set_id)
        if rank() != root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None

    broadcast.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)
