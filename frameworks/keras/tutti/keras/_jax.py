"""tutti.keras on Keras' JAX backend: the collectives of tutti.jax, which also run inside the
jax.jit-compiled train step (as XLA FFI custom calls)."""

import jax
import jax.numpy as jnp
import numpy as np

import tutti.jax as _tj
from tutti.jax import (  # noqa: F401
    Average, Max, Min, ProcessSet, Product, Sum, TuttiError, add_process_set, allgather,
    allgather_object, allreduce, alltoall, barrier, broadcast, broadcast_object, cross_rank,
    cross_size, global_process_set, grouped_allreduce, init, is_initialized, join, local_rank,
    local_size, rank, reducescatter, remove_process_set, shutdown, size)
from tutti.keras import _common
from tutti.keras._common import Compression  # noqa: F401

# What `tutti.keras` re-exports on this backend.
EXPORTS = [
    "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "Sum", "TuttiError",
    "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall", "barrier",
    "broadcast", "broadcast_object", "broadcast_variables", "cross_rank", "cross_size",
    "global_process_set", "grouped_allreduce", "init", "is_initialized", "join",
    "local_rank", "local_size", "rank", "reducescatter", "remove_process_set", "shutdown",
    "size"]


def _set_size(process_set):
    return _tj.ops._set_size(_tj.ops._set_id(process_set))


def make_allreduce_grads(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                         gradient_predivide_factor, groups, process_set):
    return _common.make_allreduce_grads(_tj, _set_size, name, compression, op,
                                        gradient_predivide_factor, process_set)


def on_update_step(optimizer, steps, fn, grads):
    """fn(grads) on the update steps only. Keras' JAX optimizer calls _clip_gradients on every
    step of gradient accumulation and keeps the result on update steps: a jax.lax.cond on the
    step keeps the allreduce to those (every rank takes the same branch)."""
    if steps == 1:
        return fn(grads)
    is_update = (optimizer._iterations + 1) % steps == 0  # (iterations counts updates)
    if isinstance(is_update, jax.core.Tracer):
        return jax.lax.cond(is_update, fn, list, grads)
    return fn(grads) if bool(is_update) else grads


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns the root's values to Keras variables (model or optimizer) on every rank."""
    variables = list(variables)
    values = _tj.broadcast_parameters([v.value for v in variables], root_rank,
                                      name="keras.broadcast_variables",
                                      process_set=process_set)
    for v, value in zip(variables, values):
        v.assign(value)


def average_scalars(values, name, process_set):
    """The Average over the set of a float vector (a numpy array); returns numpy."""
    return np.asarray(allreduce(jnp.asarray(values), op=Average, name=name,
                                process_set=process_set))


def prepare_model(model):
    """tutti.jax's collectives run inside the jitted train step: nothing to change."""


def sync_model(model):
    """During fit, Keras' JAX trainer keeps the variables' values in its own state (the
    variables are emptied); writes them back so that a callback can read and assign them."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()
