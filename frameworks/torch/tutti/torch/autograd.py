"""Differentiable collectives: allreduce, grouped_allreduce, allgather, broadcast, alltoall
and reducescatter as torch.autograd.Functions, with Horovod's gradient conventions.

Each backward is itself a collective that every rank runs in the same order, with exactly
horovod.torch's conventions (so that a script moved from Horovod trains the same):
- allreduce: allreduce of the gradient with the same op and scale factors;
- allgather: Average-allreduce of the gradient, sliced to this rank's rows;
- broadcast: Average-allreduce of the gradient on the root, zeros elsewhere;
- alltoall: alltoall of the gradient back with the received splits;
- reducescatter: allgather of the gradient, times the set size for Sum, times the scale
  factors.
The grouped variants do the same per tensor. Named ops name their backward collectives
"<name>.grad" so that they never collide.
"""
from typing import Any, List, Optional, Sequence, Union

import torch

from tutti.torch import compiled, mpi_ops
from tutti.torch.basics import ProcessSet, global_process_set, rank
from tutti.torch.compression import Compression
from tutti.torch.mpi_ops import Average, Sum, synchronize


def _grad_name(name, suffix="grad"):
    return None if not name else "%s.%s" % (name, suffix)


class TuttiAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(mpi_ops.allreduce_async(tensor, None, name, op, prescale_factor,
                                                   postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        name, op, prescale, postscale, process_set = ctx.args
        grad = synchronize(mpi_ops.allreduce_async(grad_output, None, _grad_name(name), op,
                                                   prescale, postscale, process_set))
        return grad, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None,
              name: Optional[str] = None, compression: type = Compression.none,
              op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces `tensor` over the process set and returns the result (a new tensor).

    Differentiable. op: Average (default), Sum, Min, Max or Product. `compression`
    (e.g. Compression.fp16) is applied around the transfer.
    """
    op = mpi_ops.handle_average_backwards_compatibility(op, average)
    compressed, ctx = compression.compress(tensor)
    if compiled.AVAILABLE and compiled.compiling():
        reduced = compiled.allreduce(compressed, mpi_ops._name(name), int(op),
                                     float(prescale_factor), float(postscale_factor),
                                     compiled.set_id(process_set))
    else:
        reduced = TuttiAllreduce.apply(compressed, name, op, prescale_factor,
                                       postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


class TuttiGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (name, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(mpi_ops.grouped_allreduce_async(
            list(tensors), None, name, op, prescale_factor, postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        name, op, prescale, postscale, process_set = ctx.args
        grads = synchronize(mpi_ops.grouped_allreduce_async(
            list(grad_outputs), None, _grad_name(name), op, prescale, postscale, process_set))
        return (None, None, None, None, None) + tuple(grads)


@compiled.eager
def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: type = Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors as one group; returns a list of new tensors.

    Differentiable."""
    op = mpi_ops.handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = TuttiGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                          process_set, *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def _my_rows(grad, rows, name, process_set):
    """The rows of an allgathered gradient that came from this rank."""
    counts = synchronize(mpi_ops.allgather_async(torch.tensor([rows], dtype=torch.int64),
                                                 name, process_set))
    offset = int(counts[:process_set.rank()].sum())
    return grad.narrow(0, offset, rows)


def _rows(tensor):
    return tensor.shape[0] if tensor.dim() > 0 else 1


class TuttiAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = _rows(tensor)
        ctx.name = name
        ctx.process_set = process_set
        return synchronize(mpi_ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(mpi_ops.allreduce_async(grad_output, None, _grad_name(ctx.name),
                                                   Average, 1.0, 1.0, ctx.process_set))
        grad = _my_rows(grad, ctx.rows, _grad_name(ctx.name, "grad.rows"), ctx.process_set)
        return grad, None, None


@compiled.eager
def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenates `tensor` from every rank of the set along dimension 0 (the first
    dimension may differ per rank). Differentiable."""
    return TuttiAllgather.apply(tensor, name, process_set)


class TuttiGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [_rows(t) for t in tensors]
        ctx.name = name
        ctx.process_set = process_set
        return tuple(synchronize(mpi_ops.grouped_allgather_async(list(tensors), name,
                                                                 process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = synchronize(mpi_ops.grouped_allreduce_async(
            list(grad_outputs), None, _grad_name(ctx.name), Average, 1.0, 1.0,
            ctx.process_set))
        name = _grad_name(ctx.name, "grad.rows")
        return (None, None) + tuple(
            _my_rows(g, rows, name and "%s.%d" % (name, i), ctx.process_set)
            for i, (g, rows) in enumerate(zip(grads, ctx.rows)))


@compiled.eager
def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgathers each tensor of a list (see allgather); returns a list. Differentiable."""
    return list(TuttiGroupedAllgather.apply(name, process_set, *tensors))


class TuttiBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.args = (root_rank, name, process_set)
        return synchronize(mpi_ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        root_rank, name, process_set = ctx.args
        grad = synchronize(mpi_ops.allreduce_async(grad_output, None, _grad_name(name),
                                                   Average, 1.0, 1.0, process_set))
        if rank() != root_rank:
            grad.zero_()
        return grad, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Returns the root's `tensor` on every rank (a new tensor). root_rank is a global
    rank, which must belong to the process set. Differentiable."""
    if compiled.AVAILABLE and compiled.compiling():
        return compiled.broadcast(tensor, int(root_rank), mpi_ops._name(name),
                                  compiled.set_id(process_set))
    return TuttiBroadcast.apply(tensor, root_rank, name, process_set)


class TuttiAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(mpi_ops.alltoall_async(tensor, splits, name,
                                                              process_set))
        ctx.args = (received, name, process_set)
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *_):
        received, name, process_set = ctx.args
        grad, _ = synchronize(mpi_ops.alltoall_async(grad_output, received,
                                                     _grad_name(name), process_set))
        return grad, None, None, None


@compiled.eager
def alltoall(tensor: torch.Tensor, splits: Union[Sequence[int], torch.Tensor, None] = None,
             name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> Any:
    """Sends splits[i] rows of `tensor` to rank i of the set (equal splits if None).

    Returns the received rows concatenated in rank order, and, when `splits` is given,
    also the rows received from each rank (int32 tensor). Differentiable."""
    output, received = TuttiAlltoall.apply(tensor, splits, name, process_set)
    if splits is None:
        return output
    return output, received


def _reducescatter_grad_scale(op, process_set, prescale_factor, postscale_factor):
    scale = prescale_factor * postscale_factor
    return scale * process_set.size() if op == Sum else scale


class TuttiReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = (name, process_set,
                    _reducescatter_grad_scale(op, process_set, prescale_factor,
                                              postscale_factor))
        return synchronize(mpi_ops.reducescatter_async(tensor, name, op, process_set,
                                                       prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        name, process_set, scale = ctx.args
        if scale != 1.0:
            grad_output = grad_output * scale
        grad = synchronize(mpi_ops.allgather_async(grad_output, _grad_name(name),
                                                   process_set))
        return grad, None, None, None, None, None


@compiled.eager
def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: type = Compression.none, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` over the set and returns this rank's share of dimension 0 (the
    first n % size ranks get one more row). op: Average (default), Sum, Min, Max, Product.
    Differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = TuttiReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                       postscale_factor)
    return compression.decompress(reduced, ctx)


class TuttiGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = (name, process_set,
                    _reducescatter_grad_scale(op, process_set, prescale_factor,
                                              postscale_factor))
        return tuple(synchronize(mpi_ops.grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        name, process_set, scale = ctx.args
        if scale != 1.0:
            grad_outputs = [g * scale for g in grad_outputs]
        grads = synchronize(mpi_ops.grouped_allgather_async(list(grad_outputs),
                                                            _grad_name(name), process_set))
        return (None, None, None, None, None) + tuple(grads)


@compiled.eager
def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: type = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatters each tensor of a list (see reducescatter); returns a list.
    Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    reduced = TuttiGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                              postscale_factor, *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]
