"""Variables and Python objects across ranks (horovod.tensorflow.functions)."""

import io
import pickle

import numpy as np
import tensorflow as tf

from tutti.tensorflow import basics as _basics
from tutti.tensorflow.basics import global_process_set
from tutti.tensorflow.mpi_ops import allgather, broadcast


def _assign_broadcast(variables, root_rank, process_set):
    for var in variables:
        var.assign(broadcast(tf.convert_to_tensor(var), root_rank, process_set=process_set))


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=None):
    """Assigns every variable the value it has on `root_rank`. Works on tf.Variables and
    Keras 3 variables, eagerly (one traced function, so that the broadcasts run
    concurrently) and inside a tf.function."""
    variables = list(variables)
    if not variables:
        return
    if tf.executing_eagerly():
        tf.function(lambda: _assign_broadcast(variables, root_rank, process_set))()
    else:
        _assign_broadcast(variables, root_rank, process_set)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts `variables` from `root_rank` in place (assigning each the root's value);
    returns their new values."""
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set=process_set)
    return [tf.convert_to_tensor(v) for v in variables]


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> the root's obj (broadcast_object with these arguments bound)."""
    def _fn(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return _fn


def _to_bytes_tensor(obj):
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    return tf.constant(np.frombuffer(buffer.getvalue(), dtype=np.uint8))


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """The picklable `obj` of `root_rank` on every rank of the set (eager mode)."""
    name = name or "noname"  # the same on every rank (the root's obj may differ in type)
    if _basics.rank() == root_rank or (process_set.process_set_id and
                                       process_set.rank() == root_rank):
        payload = _to_bytes_tensor(obj)
        size = tf.constant([int(payload.shape[0])], dtype=tf.int64)
    else:
        payload = None
        size = tf.constant([0], dtype=tf.int64)
    size = int(broadcast(size, root_rank, name="broadcast_object.%s.size" % name,
                         process_set=process_set).numpy()[0])
    if payload is None:
        payload = tf.zeros([size], dtype=tf.uint8)
    payload = broadcast(payload, root_rank, name="broadcast_object.%s.data" % name,
                        process_set=process_set)
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """A list of the picklable `obj` of every rank of the set, in rank order (eager mode)."""
    name = name or "noname"  # the same on every rank (the root's obj may differ in type)
    payload = _to_bytes_tensor(obj)
    sizes = allgather(tf.constant([int(payload.shape[0])], dtype=tf.int64),
                      name="allgather_object.%s.sizes" % name, process_set=process_set)
    data = allgather(payload, name="allgather_object.%s.data" % name,
                     process_set=process_set).numpy().tobytes()
    out, offset = [], 0
    for size in sizes.numpy():
        out.append(pickle.loads(data[offset:offset + int(size)]))
        offset += int(size)
    return out
