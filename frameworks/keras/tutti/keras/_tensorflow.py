"""tutti.keras on Keras' TensorFlow backend: the collectives of tutti.tensorflow."""

import warnings

import tensorflow as tf

from tutti.tensorflow import (  # noqa: F401
    Adasum, Average, Compression, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,
    add_process_set, allgather, allgather_object, allreduce, alltoall, barrier, broadcast,
    broadcast_object, broadcast_variables, cross_rank, cross_size, global_process_set,
    grouped_allreduce, init, is_initialized, join, local_rank, local_size, rank,
    reducescatter, remove_process_set, shutdown, size, start_timeline, stop_timeline)
from tutti.tensorflow import _make_allreduce_grads_fn as make_allreduce_grads  # noqa: F401

# What `tutti.keras` re-exports on this backend.
EXPORTS = [
    "Adasum", "Average", "Compression", "HorovodInternalError", "Max", "Min", "ProcessSet",
    "Product", "Sum", "add_process_set", "allgather", "allgather_object", "allreduce",
    "alltoall", "barrier", "broadcast", "broadcast_object", "broadcast_variables",
    "cross_rank", "cross_size", "global_process_set", "grouped_allreduce", "init",
    "is_initialized", "join", "local_rank", "local_size", "rank", "reducescatter",
    "remove_process_set", "shutdown", "size", "start_timeline", "stop_timeline"]


def on_update_step(optimizer, steps, fn, grads):
    """fn(grads) where Keras applies them: it calls _clip_gradients on update steps only."""
    return fn(grads)


def average_scalars(values, name, process_set):
    """The Average over the set of a float64 vector (a numpy array); returns numpy."""
    return allreduce(tf.constant(values, dtype=tf.float64), op=Average, name=name,
                     process_set=process_set).numpy()


def prepare_model(model):
    """Only some of Tutti's collectives have an XLA kernel, on CPU only (docs/tensorflow.md,
    "XLA"): a train function compiled with XLA (jit_compile=True, or Keras' "auto" where
    TensorFlow sees a GPU) may not run the callbacks' collectives. Rebuilds it without XLA,
    with a warning."""
    if getattr(model, "run_eagerly", False) or not getattr(model, "jit_compile", False):
        return
    warnings.warn(
        "tutti.keras: the model was compiled with XLA (jit_compile=True, or jit_compile="
        "\"auto\" where TensorFlow sees a GPU), but not every one of Tutti's collectives has an XLA kernel (none on GPU); "
        "training runs with jit_compile=False. Pass jit_compile=False to model.compile() to "
        "silence this.", stacklevel=3)
    model.jit_compile = False
    model.make_train_function(force=True)


def sync_model(model):
    """The model's and optimizer's variables hold the current values already."""
