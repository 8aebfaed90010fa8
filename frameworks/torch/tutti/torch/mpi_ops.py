"""Asynchronous collectives on torch tensors with horovod.torch's names and defaults.

Every op starts in the background and returns a Handle; synchronize(handle) waits (without
the GIL) and returns the output. A handle keeps every tensor the op reads or writes alive
until it is synchronized. Inputs need not be contiguous: they are copied to a contiguous
buffer, and in-place variants copy the result back.
"""

import itertools
import warnings
from typing import Any, Callable, List, Optional, Sequence, Union

import torch

from tutti.torch import _C
from tutti.torch.basics import (ProcessSet, _names_in_use, _noname_counters, _process_set_id,
                                global_process_set)

# Reduction ops. Adasum is computed in Python over alltoall (tutti.torch.adasum): allreduce
# and grouped_allreduce take it; the other reducing ops refuse it, as Horovod's do.
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

    def __new__(cls, value, keep, slot, finish, parts=None):
        handle = super().__new__(cls, value)
        handle._keep = keep
        handle._slot = slot
        handle._finish = finish
        handle._parts = parts  # for a group of ops: their Handles
        return handle


# id -> Handle for every op not yet synchronized: keeps its tensors alive even when the
# caller drops the handle.
_handle_map = {}


# Handles of groups made of several runtime ops count down from -1 (runtime handles are
# positive), so the two never collide.
_group_ids = itertools.count(-1, -1)


def _register(handle_id, keep, finish, slot=None, names=()):
    handle = Handle(handle_id, keep, slot, finish)
    handle._names = names  # the names it holds until synchronized (_take_names)
    _handle_map[handle_id] = handle
    return handle


def _take_names(op, names, set_id):
    """Marks the given names (None or "" for none) as taken on this rank until the handle of
    the op that starts with them is synchronized; returns their keys for _register.

    The runtime refuses a name only while an op of that name runs, which can end
    microseconds after it starts; a program that starts a name again before synchronizing
    the first op has a bug whose symptom would then depend on timing. Here it is refused
    every time (DuplicateNameError, a ValueError), as Horovod's own tests expect."""
    keys = tuple((set_id, str(n)) for n in names if n)
    for key in keys:
        if key in _names_in_use:
            error = _C.DuplicateNameError(
                "%s '%s': an op of this name (%s) was started on this rank and its handle is "
                "not synchronized yet; synchronize it before starting the name again"
                % (op, key[1], _names_in_use[key]))
            error.code = 10  # TUTTI_ERR_DUPLICATE_NAME, as the runtime's own refusal
            raise error
    for key in keys:
        _names_in_use[key] = op
    return keys


def _release_names(keys):
    for key in keys:
        _names_in_use.pop(key, None)


def _submit(op, names, set_id, start):
    """Takes `names`, then start(): the runtime's handle id (or (id, slot)); the names are
    given back if the runtime refuses the op."""
    keys = _take_names(op, names, set_id)
    try:
        return start(), keys
    except BaseException:
        _release_names(keys)
        raise


def _register_group(parts, finish):
    """One handle for several ops: synchronize() waits for each and returns
    finish(list of their outputs)."""
    for part in parts:
        _handle_map.pop(int(part), None)
    group_id = next(_group_ids)
    handle = Handle(group_id, (), None, finish, parts)
    _handle_map[group_id] = handle
    return handle


def poll(handle: int) -> bool:
    """True when the op behind `handle` has finished (synchronize() will not block)."""
    entry = _handle_map.get(int(handle))
    if entry is None:
        raise ValueError("poll(): unknown or already synchronized handle %d" % int(handle))
    if entry._parts is not None:
        return all(bool(_C.poll(int(part))) for part in entry._parts)
    return bool(_C.poll(int(entry)))


def synchronize(handle: int) -> Any:
    """Waits for the op and returns its output.

    Raises TuttiError (alias HorovodInternalError) with the runtime's message on failure, and
    ValueError for a handle that is unknown or was synchronized already (as poll() does;
    Horovod returns None there, which hides a second wait on a handle as a None result).
    """
    entry = _handle_map.pop(int(handle), None)
    if entry is None:
        raise ValueError("synchronize(): unknown or already synchronized handle %d"
                         % int(handle))
    if entry._parts is not None:
        outputs = []
        for part in entry._parts:
            _handle_map[int(part)] = part
            outputs.append(synchronize(part))
        return entry._finish(outputs)
    try:
        output, recv_splits, last_joined = _C.wait(int(entry), -1.0, entry._slot)
    except _C.TuttiError as error:
        if getattr(error, "code", None) == 8:  # TUTTI_ERR_IN_PROGRESS: still running
            _handle_map[int(entry)] = entry
        else:
            _release_names(entry._names)
        raise
    _release_names(entry._names)
    return entry._finish(output, recv_splits, last_joined)


def handle_average_backwards_compatibility(op: Optional[int], average: Optional[bool]):
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
        raise NotImplementedError("%s: the Adasum reduction is supported by allreduce and "
                                  "grouped_allreduce only (as in Horovod)" % what)
    if op not in _VALID_OPS:
        raise ValueError("%s: unknown reduction op %r (expected Sum, Average, Min, Max or "
                         "Product)" % (what, op))
    return int(op)


def _name(name):
    return "" if name is None else str(name)


def _auto_name(op, process_set_id):
    """A name for an unnamed op that builds a group: "<op>.noname.<n>", counted per op and
    process set so that every rank of the set derives the same one (from 0 after init)."""
    count = _noname_counters.get((op, process_set_id), 0)
    _noname_counters[(op, process_set_id)] = count + 1
    if process_set_id:
        return "%s.noname.set%d.%d" % (op, process_set_id, count)
    return "%s.noname.%d" % (op, count)


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
    if op == Adasum:
        return _adasum_async([tensor], [output], [name], prescale_factor, postscale_factor,
                             process_set, lambda results: results[0])
    op = _check_op(op, "allreduce")
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    target = source if output is tensor else _contiguous(_detach(output))
    handle_id, names = _submit("allreduce", [name], set_id, lambda: _C.allreduce_async(
        _name(name), source, target, op, float(prescale_factor), float(postscale_factor),
        set_id))
    result = tensor if output is tensor else output
    finish = lambda *_: _copy_back(result, target)  # noqa: E731
    return _register(handle_id, (tensor, output, source, target), finish, names=names)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts reducing `tensor` over the process set into a new tensor; returns a Handle.

    The reduction is keyed by `name`: every rank must use the same name, dtype and shape.
    op: Average (default), Sum, Min, Max or Product; result =
    postscale_factor * reduce(prescale_factor * tensor).
    """
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Starts reducing `tensor` in place; returns a Handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None,
               name: Optional[str] = None, op: Optional[int] = None,
               prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces `tensor` in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _adasum_async(tensors, outputs, names, prescale_factor, postscale_factor, process_set,
                  result):
    """Adasum-reduces each tensor into its output now (tutti.torch.adasum); returns a handle
    that is complete, whose synchronize() gives result(outputs)."""
    from tutti.torch import adasum  # noqa: E402  (it imports this module)
    for tensor, name in zip(tensors, names):  # every check before any exchange starts
        adasum.check(tensor, _name(name), process_set)
    for tensor, output, name in zip(tensors, outputs, names):
        _copy_back(output, adasum.allreduce(tensor, name, prescale_factor, postscale_factor,
                                            process_set))
    return _register_group([], lambda _: result(outputs))


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                             postscale_factor, process_set):
    set_id = _process_set_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    base = _name(name) or _auto_name("grouped_allreduce", set_id)
    names = ["%s.%d" % (base, i) for i in range(len(tensors))]
    if op == Adasum:
        return _adasum_async(tensors, tensors if outputs is None else list(outputs), names,
                             prescale_factor, postscale_factor, process_set, list)
    op = _check_op(op, "grouped_allreduce")
    sources = [_contiguous(_detach(t)) for t in tensors]
    in_place = outputs is None
    targets = sources if in_place else [_contiguous(_detach(o)) for o in outputs]
    handle_id, keys = _submit("grouped_allreduce", names, set_id,
                              lambda: _C.grouped_allreduce_async(
                                  names, sources, targets, op, float(prescale_factor),
                                  float(postscale_factor), set_id))
    results = tensors if in_place else list(outputs)
    finish = lambda *_: [_copy_back(r, t) for r, t in zip(results, targets)]  # noqa: E731
    return _register(handle_id, (tensors, outputs, sources, targets), finish, names=keys)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Starts reducing a list of tensors as one group (one handle; a list of outputs)."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> Handle:
    """Starts reducing a list of tensors in place as one group."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, None, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors in place as one group and returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather, broadcast, alltoall, reducescatter ---------------------------------------

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts concatenating `tensor` from every rank of the set along dimension 0.

    The first dimension may differ per rank; the others must match.
    """
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    (handle_id, slot), names = _submit("allgather", [name], set_id,
                                       lambda: _C.allgather_async(_name(name), source, set_id))
    return _register(handle_id, (tensor, source), lambda output, *_: output, slot, names)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts broadcasting the root's `tensor` into a new tensor on every rank.

    root_rank is a global rank, which must belong to the process set (as in Horovod).
    """
    output = _detach(tensor).clone(memory_format=torch.contiguous_format)
    return _broadcast_async(output, output, root_rank, name, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Starts broadcasting the root's `tensor` in place."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def _root_in_set(root_rank, process_set, what):
    """The position in the process set of global rank `root_rank`."""
    set_id = _process_set_id(process_set)
    root_rank = int(root_rank)
    if set_id == 0:
        return root_rank
    ranks = _C.process_set_ranks(set_id)
    if root_rank not in ranks:
        raise ValueError("%s: root_rank %d is not in the process set (ranks %s); root_rank "
                         "is a global rank" % (what, root_rank, list(ranks)))
    return list(ranks).index(root_rank)


def _broadcast_async(tensor, result, root_rank, name, process_set):
    set_id = _process_set_id(process_set)
    root = _root_in_set(root_rank, process_set, "broadcast")
    buffer = _contiguous(_detach(tensor))
    handle_id, names = _submit("broadcast", [name], set_id,
                               lambda: _C.broadcast_async(_name(name), buffer, root, set_id))
    finish = lambda *_: _copy_back(result, buffer)  # noqa: E731
    return _register(handle_id, (tensor, buffer), finish, names=names)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Broadcasts the root's `tensor` in place and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _splits_list(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
            raise ValueError("alltoall: splits must hold integers (int32 as in Horovod), "
                             "got a %s tensor" % splits.dtype)
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor: torch.Tensor, splits: Union[Sequence[int], torch.Tensor,
                   None] = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Starts sending splits[i] rows of `tensor` to rank i of the set (equal splits when
    None). synchronize() returns (output, received_splits as an int32 tensor)."""
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    (handle_id, slot), names = _submit("alltoall", [name], set_id, lambda: _C.alltoall_async(
        _name(name), source, _splits_list(splits), set_id))

    def finish(output, recv_splits, _):
        return output, torch.tensor(recv_splits, dtype=torch.int32)

    return _register(handle_id, (tensor, source, splits), finish, slot, names)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Starts reducing `tensor` over the set and scattering dimension 0: rank r gets its
    share of rows (the first n % size ranks one more)."""
    op = _check_op(op, "reducescatter")
    set_id = _process_set_id(process_set)
    source = _contiguous(_detach(tensor))
    (handle_id, slot), names = _submit("reducescatter", [name], set_id,
                                       lambda: _C.reducescatter_async(
                                           _name(name), source, op, float(prescale_factor),
                                           float(postscale_factor), set_id))
    return _register(handle_id, (tensor, source), lambda output, *_: output, slot, names)


# ---- grouped allgather and reducescatter, sparse allreduce --------------------------------

def _grouped_async(start, tensors, name, what, process_set):
    """Starts start(tensor, name_i) for each tensor, under one handle whose
    synchronize() returns the list of outputs."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    base = _name(name) or _auto_name(what, _process_set_id(process_set))
    parts = [start(t, "%s.%d" % (base, i)) for i, t in enumerate(tensors)]
    return _register_group(parts, list)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Starts allgathering each tensor of a list; synchronize() returns a list."""
    return _grouped_async(lambda t, n: allgather_async(t, n, process_set), tensors, name,
                          "grouped_allgather", process_set)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: int = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Starts reducescattering each tensor of a list; synchronize() returns a list."""
    return _grouped_async(
        lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor,
                                         postscale_factor),
        tensors, name, "grouped_reducescatter", process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str], op: Optional[int],
                           process_set: ProcessSet = global_process_set) -> Callable[[],
                           torch.Tensor]:
    """Starts reducing a sparse COO tensor by allgathering its indices and values; returns
    a function that waits and returns the reduced sparse tensor (Sum or Average)."""
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async: only Sum and Average are supported, got %r"
                         % (op,))
    tensor = tensor.coalesce()
    base = _name(name) or _auto_name("sparse_allreduce", _process_set_id(process_set))
    indices = allgather_async(tensor.indices().t().contiguous(), base + ".indices",
                              process_set)
    values = allgather_async(tensor.values(), base + ".values", process_set)

    def wait():
        all_values = synchronize(values)
        all_indices = synchronize(indices)
        if op == Average:
            all_values = all_values / process_set.size()
        with warnings.catch_warnings():  # torch 2.x: a note that invariants are unchecked
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_coo_tensor(all_indices.t(), all_values, tensor.size())

    return wait


# ---- barrier and join ---------------------------------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of the set has entered the barrier."""
    synchronize(_register(_C.barrier_async(_process_set_id(process_set)), (), _returns(None)))


def join(device: int = -1, process_set: ProcessSet = global_process_set) -> int:
    """Declares this rank out of data and waits until every rank has joined.

    Until then, this rank contributes zeros to the other ranks' allreduces. Returns the
    rank that joined last. `device` is accepted for Horovod compatibility.
    """
    del device
    handle_id = _C.join_async(_process_set_id(process_set))
    return synchronize(_register(handle_id, (), lambda output, splits, last: last))
