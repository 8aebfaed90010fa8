"""Model/optimizer state and Python object helpers (horovod.torch.functions)."""

import io
import pickle
from typing import Any, List, Optional

import torch

from tutti.torch import mpi_ops
from tutti.torch.basics import ProcessSet, _process_set_id, global_process_set, rank
from tutti.torch.mpi_ops import synchronize


def broadcast_parameters(params: Any, root_rank: int,
                         process_set: ProcessSet = global_process_set, *,
                         prefix: str = "Parameter.") -> None:
    """Broadcasts parameters (a state_dict, or a list of (name, tensor) pairs or tensors)
    in place from `root_rank`, e.g. broadcast_parameters(model.state_dict(), root_rank=0)."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s (expected a dict "
                         "or a list)" % type(params).__name__)
    handles = []
    for name, tensor in params:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError("broadcast_parameters: %r is a %s, not a tensor"
                             % (name, type(tensor).__name__))
        full_name = prefix + name if name is not None else None
        handles.append(mpi_ops.broadcast_async_(tensor, root_rank, full_name, process_set))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set: ProcessSet = global_process_set, *,
                              prefix: str = "Parameter.") -> None:
    """Broadcasts an optimizer's state (tensors in place) and its hyper-parameters (lr,
    momentum, ...) from `root_rank`. A fresh optimizer first takes one zero-gradient step
    so that its state exists on every rank."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _create_optimizer_state(optimizer)
        state_dict = optimizer.state_dict()

    # Hyper-parameters may be of any type (floats, tuples, bools, None): sent as one object.
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in state_dict["param_groups"]]
    options = broadcast_object(options, root_rank, prefix + "optimizer.options", process_set)
    for group, group_options in zip(optimizer.param_groups, options):
        group.update(group_options)

    # Per-parameter state: tensors are broadcast in place (state_dict shares them with the
    # optimizer); other values travel together as one object and are written back.
    tensors = []
    scalars = {}
    for index, group in enumerate(state_dict["param_groups"]):
        for pid in group["params"]:
            for key, value in sorted(state_dict["state"].get(pid, {}).items()):
                full_name = "%soptimizer.%d.%s.%s" % (prefix, index, pid, key)
                if torch.is_tensor(value):
                    tensors.append((full_name, value))
                else:
                    scalars[(pid, key)] = value
    broadcast_parameters(tensors, root_rank, prefix="", process_set=process_set)
    scalars = broadcast_object(scalars, root_rank, prefix + "optimizer.scalars", process_set)
    for (pid, key), value in scalars.items():
        # state_dict()["state"][pid] is the optimizer's own per-parameter dict.
        state_dict["state"][pid][key] = value


def _create_optimizer_state(optimizer):
    """One step with zero gradients, so that a fresh optimizer's state exists on every rank;
    the parameters are as before it, and so are the gradients that existed. Gradients left
    by the last backward pass (an elastic reset syncs mid-training) and weight decay would
    otherwise move the parameters after they were broadcast, differently on each rank.
    (torch 2's SGD without momentum keeps no state, so this runs at every sync of such an
    optimizer.) A trainable parameter that had no gradient keeps the zero one, as in
    horovod.torch; a frozen one (requires_grad=False) still has none."""
    params = [p for group in optimizer.param_groups for p in group["params"]
              if p.requires_grad]
    kept = [(p, p.detach().clone(), p.grad) for p in params]
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
        try:
            # A DistributedOptimizer's step() would allreduce; the wrapped step is enough.
            if hasattr(optimizer, "_tutti_distributed"):
                super(optimizer.__class__, optimizer).step()
            else:
                optimizer.step()
        finally:
            for p, value, grad in kept:
                p.copy_(value)
                if grad is not None:
                    p.grad = grad
                else:
                    p.grad.zero_()  # the step may have written into it


def _to_byte_tensor(obj):
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_byte_tensor(tensor):
    # Through a bytearray rather than tensor.numpy(): pip's torch does not require numpy.
    data = bytearray(tensor.numel())
    if data:
        torch.frombuffer(data, dtype=torch.uint8).copy_(tensor)
    return pickle.loads(data)


def _object_name(name, what, process_set):
    """The given name, else one every rank derives alike (never from the object, which
    may differ between ranks, e.g. obj if rank == 0 else None)."""
    return name or mpi_ops._auto_name(what, _process_set_id(process_set))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns the root's picklable `obj` on every rank of the set (root_rank: a global
    rank). Only the root's `obj` is read: others may pass None."""
    name = _object_name(name, "broadcast_object", process_set)
    is_root = rank() == root_rank
    if is_root:
        payload = _to_byte_tensor(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, name + ".size", process_set)
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    mpi_ops.broadcast_(payload, root_rank, name + ".data", process_set)
    return obj if is_root else _from_byte_tensor(payload)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Returns the list of every rank's picklable `obj`, in rank order of the set."""
    name = _object_name(name, "allgather_object", process_set)
    payload = _to_byte_tensor(obj)
    sizes = synchronize(mpi_ops.allgather_async(
        torch.tensor([payload.numel()], dtype=torch.int64), name + ".sizes", process_set))
    data = synchronize(mpi_ops.allgather_async(payload, name + ".data", process_set))
    objects = []
    offset = 0
    for size in sizes.tolist():
        objects.append(_from_byte_tensor(data[offset:offset + size]))
        offset += size
    return objects
