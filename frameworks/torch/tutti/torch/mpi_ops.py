"""Asynchronous collectives on torch tensors with horovod.torch's names and defaults.

Every op starts in the background and returns a Handle; synchronize(handle) waits (without
the GIL) and returns the output. A handle keeps every tensor the op reads or writes alive
until it is synchronized. Inputs need not be contiguous: they are copied to a contiguous
buffer, and in-place variants copy the result back.
"""

import warnings

import torch

from tutti.torch import _C
from tutti.torch.basics import _process_set_id, global_process_set

# Reduction ops. Adasum exists for scripts that name it; Tutti does not implement it.
Sum = _C.SUM
Average = _C.AVERAGE
Min = _C.MIN
Max = _C.MAX
Product = _C.PRODUCT
Adasum = -1
_VALID_OPS = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product"}


class Handle(int):
    """An op in flight: an int (usable as a dict key like Horovod's) that also holds the
    tensors the op uses and how to produce its result."""

    def __new__(cls, value, keep, slot, finish):
        handle = super().__new__(cls, value)
        handle._keep = keep
        handle._slot = slot
        handle._finish = finish
        return handle


# id -> Handle for every op not yet synchronized: keeps its tensors alive even when the
# caller drops the handle.
_handle_map = {}


def _register(handle_id, keep, finish, slot=None):
    handle = Handle(handle_id, keep, slot, finish)
    _handle_map[handle_id] = handle
    return handle


def poll(handle):
    """True when the op behind `handle` has finished (synchronize() will not block)."""
    if int(handle) not in _handle_map:
        raise ValueError("poll(): unknown or already synchronized handle %d" % int(handle))
    return bool(_C.poll(int(handle)))


def synchronize(handle):
    """Waits for the op and returns its output (None for an unknown handle, as Horovod).

    Raises TuttiError (alias HorovodInternalError) with the runtime's message on failure.
    """
    entry = _handle_map.pop(int(handle), None)
    if entry is None:
        return None
    try:
        output, recv_splits, last_joined = _C.wait(int(entry), -1.0, entry._slot)
    except _C.TuttiError as error:
        if getattr(error, "code", None) == 8:  # TUTTI_ERR_IN_PROGRESS: still running
            _handle_map[int(entry)] = entry
        raise
    return entry._finish(output, recv_splits, last_joined)


def handle_average_backwards_compatibility(op, average):
    """Resolves the deprecated `average=` argument into an op (default Average)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. "
                             "Please provide only one of them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning)
        op = Average if average else Sum
    else:
        op = Average
    return op


def _check_op(op, what):
    if op == Adasum:
        raise NotImplementedError("%s: the Adasum reduction is not supported by Tutti" % what)
    if op not in _VALID_OPS:
        raise ValueError("%s: unknown reduction op %r (expected Sum, Average, Min, Max or "
                         "Product)" % (what, op))
    return int(op)


def _name(name):
    return "" if name is None else str(name)


def _contiguous(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("expected a torch.Tensor, got %s" % type(tensor).__name__)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _detach(tensor):
    return tensor.detach()


def _copy_back(target, buffer):
    """Copies an op's contiguous buffer into `target` unless they are the same memory."""
    if buffer.data_ptr() != target.data_ptr() or buffer.stride() != target.stride():
        with torch.no_grad():
            target.copy_(buffer)
    return target


def _returns(value):
    return lambda output, recv_splits, last_joined: value


# ---- allreduce -------------------------------------------------------------------------

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                     process_set):
    """Reduces `tensor` into `output` (which may be `tensor`: in place)."""
    op = _check_op(op, "allreduce")
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    target = source if output is tensor else _contiguous(_detach(output))
    handle_id = _C.allreduce_async(_name(name), source, target, op, float(prescale_factor),
                                   float(postscale_factor), set_id)
    result = tensor if output is tensor else output
    finish = lambda *_: _copy_back(result, target)  # noqa: E731
    return _register(handle_id, (tensor, output, source, target), finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the process set into a new tensor; returns a Handle.

    The reduction is keyed by `name`: every rank must use the same name, dtype and shape.
    op: Average (default), Sum, Min, Max or Product; result =
    postscale_factor * reduce(prescale_factor * tensor).
    """
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` in place; returns a Handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                             postscale_factor, process_set):
    op = _check_op(op, "grouped_allreduce")
    set_id = _process_set_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    base = _name(name)
    names = ["%s.%d" % (base, i) if base else "" for i in range(len(tensors))]
    sources = [_contiguous(_detach(t)) for t in tensors]
    in_place = outputs is None
    targets = sources if in_place else [_contiguous(_detach(o)) for o in outputs]
    handle_id = _C.grouped_allreduce_async(names, sources, targets, op,
                                           float(prescale_factor), float(postscale_factor),
                                           set_id)
    results = tensors if in_place else list(outputs)
    finish = lambda *_: [_copy_back(r, t) for r, t in zip(results, targets)]  # noqa: E731
    return _register(handle_id, (tensors, outputs, sources, targets), finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one group (one handle; a list of outputs)."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors in place as one group."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, None, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors in place as one group and returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather, broadcast, alltoall, reducescatter ---------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating `tensor` from every rank of the set along dimension 0.

    The first dimension may differ per rank; the others must match.
    """
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    handle_id, slot = _C.allgather_async(_name(name), source, set_id)
    return _register(handle_id, (tensor, source), lambda output, *_: output, slot)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting the root's `tensor` into a new tensor on every rank.

    root_rank is a rank within the process set (for the global set: the global rank).
    """
    output = _detach(tensor).clone(memory_format=torch.contiguous_format)
    return _broadcast_async(output, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting the root's `tensor` in place."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def _broadcast_async(tensor, result, root_rank, name, process_set):
    set_id = _process_set_id(process_set)
    buffer = _contiguous(_detach(tensor))
    handle_id = _C.broadcast_async(_name(name), buffer, int(root_rank), set_id)
    finish = lambda *_: _copy_back(result, buffer)  # noqa: E731
    return _register(handle_id, (tensor, buffer), finish)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Broadcasts the root's `tensor` in place and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _splits_list(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[i] rows of `tensor` to rank i of the set (equal splits when
    None). synchronize() returns (output, received_splits as an int32 tensor)."""
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    handle_id, slot = _C.alltoall_async(_name(name), source, _splits_list(splits), set_id)

    def finish(output, recv_splits, _):
        return output, torch.tensor(recv_splits, dtype=torch.int32)

    return _register(handle_id, (tensor, source, splits), finish, slot)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over the set and scattering dimension 0: rank r gets its
    share of rows (the first n % size ranks one more)."""
    op = _check_op(op, "reducescatter")
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    handle_id, slot = _C.reducescatter_async(_name(name), source, op, float(prescale_factor),
                                             float(postscale_factor), set_id)
    return _register(handle_id, (tensor, source), lambda output, *_: output, slot)


# ---- barrier and join ---------------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every rank of the set has entered the barrier."""
    synchronize(_register(_C.barrier_async(_process_set_id(process_set)), (), _returns(None)))


def join(device=-1, process_set=global_process_set):
    """Declares this rank out of data and waits until every rank has joined.

    Until then, this rank contributes zeros to the other ranks' allreduces. Returns the
    rank that joined last. `device` is accepted for Horovod compatibility.
    """
    del device
    handle_id = _C.join_async(_process_set_id(process_set))
    return synchronize(_register(handle_id, (), lambda output, splits, last: last))
