"""tutti.keras on Keras' torch backend: the collectives of tutti.torch (Keras' torch optimizer
path is eager)."""

import numpy as np
import torch

import tutti.torch as _tt
from tutti.torch import (  # noqa: F401
    Average, Compression, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,
    add_process_set, allgather, allgather_object, allreduce, alltoall, barrier, broadcast,
    broadcast_object, cross_rank, cross_size, global_process_set, grouped_allreduce, init,
    is_initialized, join, local_rank, local_size, rank, reducescatter, remove_process_set,
    shutdown, size, start_timeline, stop_timeline)
from tutti.keras import _common

# What `tutti.keras` re-exports on this backend.
EXPORTS = [
    "Average", "Compression", "HorovodInternalError", "Max", "Min", "ProcessSet", "Product",
    "Sum", "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall",
    "barrier", "broadcast", "broadcast_object", "broadcast_variables", "cross_rank",
    "cross_size", "global_process_set", "grouped_allreduce", "init", "is_initialized", "join",
    "local_rank", "local_size", "rank", "reducescatter", "remove_process_set", "shutdown",
    "size", "start_timeline", "stop_timeline"]


def _set_size(process_set):
    return process_set.size()


def make_allreduce_grads(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                         gradient_predivide_factor, groups, process_set):
    return _common.make_allreduce_grads(_tt, _set_size, name, compression, op,
                                        gradient_predivide_factor, process_set)


def on_update_step(optimizer, steps, fn, grads):
    """fn(grads) where Keras applies them: it calls _clip_gradients on update steps only."""
    return fn(grads)


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns the root's values to Keras variables (model or optimizer) on every rank."""
    variables = list(variables)
    handles = [_tt.broadcast_async(v.value.detach(), root_rank,
                                   name="keras.broadcast_variables.%d" % i,
                                   process_set=process_set)
               for i, v in enumerate(variables)]
    for v, handle in zip(variables, handles):
        v.assign(_tt.synchronize(handle))


def average_scalars(values, name, process_set):
    """The Average over the set of a float64 vector (a numpy array); returns numpy."""
    reduced = allreduce(torch.from_numpy(np.asarray(values, np.float64)), op=Average,
                        name=name, process_set=process_set)
    return reduced.numpy()


def prepare_model(model):
    """Keras' torch train step is eager (or torch.compile'd, where the grouped allreduce
    breaks the graph and runs eagerly): nothing to change."""


def sync_model(model):
    """The model's and optimizer's variables hold the current values already."""
