"""Variables and Python objects across ranks (horovod.tensorflow.functions)."""

import io
import pickle

import numpy as np
import tensorflow as tf

from tutti.tensorflow import basics as _basics
from tutti.tensorflow.basics import global_process_set
from tutti.tensorflow.mpi_ops import allgather, broadcast


def _assign_broadcast(variables, root_rank, process_set):
    return [var.assign(broadcast(tf.convert_to_tensor(var), root_rank, process_set=process_set))
            for var in variables]


@_basics.raises_internal_error
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=None):
    """Assigns every variable the value it has on `root_rank`. Works on tf.Variables and
    Keras 3 variables: eagerly (one traced function, so that the broadcasts run
    concurrently), inside a tf.function, and in a TF1-style graph, where it returns the op
    that assigns them (run it in a session)."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    if tf.executing_eagerly():
        tf.function(lambda: _assign_broadcast(variables, root_rank, process_set))()
        return None
    return tf.group(*_assign_broadcast(variables, root_rank, process_set))


def broadcast_global_variables(root_rank):
    """TF1 graphs: the op that broadcasts every global variable from `root_rank`. Eagerly it
    raises RuntimeError (there are no global variables): use broadcast_variables."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts `variables` from `root_rank` in place (assigning each the root's value);
    returns their new values (in a graph: tensors that read them after the assignment)."""
    variables = list(variables)
    if tf.executing_eagerly():
        broadcast_variables(variables, root_rank, process_set=process_set)
        return [tf.convert_to_tensor(v) for v in variables]
    assigns = _assign_broadcast(variables, root_rank, process_set)
    with tf.control_dependencies(assigns):
        return [tf.identity(v.read_value() if hasattr(v, "read_value") else v)
                for v in variables]


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> the root's obj (broadcast_object with these arguments bound)."""
    def _fn(obj):
        return broadcast_object(obj, root_rank, session=session, name=name,
                                process_set=process_set)
    return _fn


def _to_numpy(tensor, session):
    """The value of `tensor`: eagerly its numpy(); in a graph, run in `session` (or the
    default session, or a new one)."""
    if tf.executing_eagerly():
        return tensor.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        with tf.compat.v1.Session() as own:
            return own.run(tensor)
    return session.run(tensor)


def _to_bytes_tensor(obj):
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    return tf.constant(np.frombuffer(buffer.getvalue(), dtype=np.uint8))


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """The picklable `obj` of `root_rank` on every rank of the set (eagerly, or in a
    TF1-style graph through `session`)."""
    name = name or "noname"  # the same on every rank (the root's obj may differ in type)
    if _basics.rank() == root_rank:  # a global rank, as in every broadcast
        payload = _to_bytes_tensor(obj)
        size = tf.constant([int(payload.shape[0])], dtype=tf.int64)
    else:
        payload = None
        size = tf.constant([0], dtype=tf.int64)
    size = int(_to_numpy(broadcast(size, root_rank, name="broadcast_object.%s.size" % name,
                                   process_set=process_set), session)[0])
    if payload is None:
        payload = tf.zeros([size], dtype=tf.uint8)
    payload = broadcast(payload, root_rank, name="broadcast_object.%s.data" % name,
                        process_set=process_set)
    return pickle.loads(_to_numpy(payload, session).tobytes())


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """A list of the picklable `obj` of every rank of the set, in rank order (eagerly, or in
    a TF1-style graph through `session`)."""
    name = name or "noname"  # the same on every rank (the root's obj may differ in type)
    payload = _to_bytes_tensor(obj)
    sizes = allgather(tf.constant([int(payload.shape[0])], dtype=tf.int64),
                      name="allgather_object.%s.sizes" % name, process_set=process_set)
    data = _to_numpy(allgather(payload, name="allgather_object.%s.data" % name,
                               process_set=process_set), session).tobytes()
    out, offset = [], 0
    for size in _to_numpy(sizes, session):
        out.append(pickle.loads(data[offset:offset + int(size)]))
        offset += int(size)
    return out
