"""The collectives of tutti.tensorflow as TensorFlow ops, and their gradients as Horovod
defines them (horovod.tensorflow.mpi_ops).

Each op is one of the op library's asynchronous kernels (TuttiAllreduce, ...): it runs eagerly,
inside tf.function and in graphs. Names: an op named by the caller carries that name into
Tutti's negotiation; unnamed, inside a graph it is named after its input tensor (unique in the
graph, the same on every rank that traced the same code), and eagerly Tutti numbers it
("allreduce.noname.<n>", the same on ranks that issue their ops in the same order).
"""

import re

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from tutti.tensorflow import basics as _basics
from tutti.tensorflow.basics import ProcessSet, global_process_set

_lib = _basics.ops
# Eagerly, an op that fails because a peer died or the job is being reset raises
# HorovodInternalError (basics.internal_error); inside a tf.function the error comes out of
# the function's call, where hvd.elastic.run recognizes it.
_raises_internal_error = _basics.raises_internal_error

# The reduction ops (the same values as tutti.torch's; Tutti's C API tutti_reduce_op_t).
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4
Adasum = -1
_VALID_OPS = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product"}


def _check_op(op, what):
    if op == Adasum:
        raise NotImplementedError(
            "%s: the Adasum reduction is not supported by tutti.tensorflow (use Sum or "
            "Average; docs/tensorflow.md)" % what)
    if op not in _VALID_OPS:
        raise ValueError("%s: unknown reduction op %r (expected Sum, Average, Min, Max or "
                         "Product)" % (what, op))
    return int(op)


def handle_average_backwards_compatibility(op, average):
    """Resolves the deprecated `average=` argument into an op (default Average)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one "
                             "of them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def _executing_eagerly():
    return tf.executing_eagerly()


def _normalize_name(name):
    """A tensor or op name as a name TensorFlow accepts in a scope."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _op_name(kind, tensor, name):
    """The name the op carries into Tutti's negotiation ("" lets Tutti number it)."""
    if name is not None:
        return str(name)
    if _executing_eagerly():
        return ""
    return "%s.%s" % (kind, _normalize_name(tensor.name))


def _set_id(process_set):
    return _basics._process_set_id(process_set)


def _temp_process_set(process_set_id):
    if process_set_id == 0:
        return global_process_set
    found = _basics._registered.get(process_set_id)
    if found is None:
        raise ValueError("process set %d is not registered on this rank" % process_set_id)
    return found


def _set_size(process_set):
    return process_set.size() if process_set.process_set_id else _basics.size()


# ---- allreduce -------------------------------------------------------------------------

@_raises_internal_error
def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
    """Reduces `tensor` over the process set (default: sum). Every rank must use the same
    name, dtype and shape."""
    return _lib.tutti_allreduce(tensor, reduce_op=_check_op(op, "allreduce"),
                                prescale_factor=float(prescale_factor),
                                postscale_factor=float(postscale_factor),
                                process_set=_set_id(process_set),
                                tensor_name=_op_name("allreduce", tensor, name))


@_tf_ops.RegisterGradient("TuttiAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of an allreduce: the same allreduce of the gradient (as Horovod)."""
    return _allreduce(grad, op=op.get_attr("reduce_op"),
                      prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"),
                      process_set=_temp_process_set(op.get_attr("process_set")))


def _grouped_names(kind, tensors, name):
    if name is not None:
        return ["%s.%d" % (name, i) for i in range(len(tensors))]
    if _executing_eagerly():
        base = "%s.noname.%d" % (kind, _basics._next_noname(kind))
        return ["%s.%d" % (base, i) for i in range(len(tensors))]
    return ["%s.%s" % (kind, _normalize_name(t.name)) for t in tensors]


@_raises_internal_error
def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """Reduces every tensor of the list in one negotiated group; returns a list."""
    tensors = list(tensors)
    if not tensors:
        return []
    return list(_lib.tutti_grouped_allreduce(
        tensors, reduce_op=_check_op(op, "grouped_allreduce"),
        prescale_factor=float(prescale_factor), postscale_factor=float(postscale_factor),
        process_set=_set_id(process_set),
        tensor_names=_grouped_names("grouped_allreduce", tensors, name)))


@_tf_ops.RegisterGradient("TuttiGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              process_set=_temp_process_set(op.get_attr("process_set")))


# ---- allgather -------------------------------------------------------------------------

@_raises_internal_error
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates `tensor` of every rank of the set on its first dimension (which may
    differ between ranks; the other dimensions must agree)."""
    return _lib.tutti_allgather(tensor, process_set=_set_id(process_set),
                                tensor_name=_op_name("allgather", tensor, name))


@_tf_ops.RegisterGradient("TuttiAllgather")
def _allgather_grad(op, grad):
    """The gradient of an allgather, as Horovod defines it: the gradient averaged over the
    set, this rank's rows of it."""
    process_set = _temp_process_set(op.get_attr("process_set"))
    grad = _allreduce(grad, op=Average, process_set=process_set)
    with tf.device("/cpu:0"):
        dim0 = tf.reshape(tf.shape(op.inputs[0], out_type=tf.int64)[0], [1])
        n = _set_size(process_set)
        dims = tf.reshape(allgather(dim0, process_set=process_set), [n])
    splits = tf.split(grad, num_or_size_splits=dims, axis=0, num=n)
    return splits[process_set.rank() if process_set.process_set_id else _basics.rank()]


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of each tensor of the list (one op each)."""
    names = [None] * len(tensors) if name is None else ["%s.%d" % (name, i)
                                                         for i in range(len(tensors))]
    return [allgather(t, name=n, process_set=process_set) for t, n in zip(tensors, names)]


# ---- broadcast -------------------------------------------------------------------------

def _root_in_set(root_rank, process_set, what):
    """The position in the process set of global rank `root_rank` (what the op takes)."""
    set_id = _set_id(process_set)
    root_rank = int(root_rank)
    if set_id == 0:
        return root_rank
    ranks = list(_temp_process_set(set_id).ranks)
    if root_rank not in ranks:
        raise ValueError("%s: root_rank %d is not in the process set (ranks %s); root_rank "
                         "is a global rank" % (what, root_rank, ranks))
    return ranks.index(root_rank)


@_raises_internal_error
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """`tensor` of global rank `root_rank` (a member of the set, as in Horovod) on every
    rank of the set."""
    return _lib.tutti_broadcast(tensor, root_rank=_root_in_set(root_rank, process_set,
                                                               "broadcast"),
                                process_set=_set_id(process_set),
                                tensor_name=_op_name("broadcast", tensor, name))


@_tf_ops.RegisterGradient("TuttiBroadcast")
def _broadcast_grad(op, grad):
    """The gradient of a broadcast, as Horovod defines it: the gradient averaged over the
    set on the root, zero on the other ranks."""
    process_set = _temp_process_set(op.get_attr("process_set"))
    reduced = _allreduce(grad, op=Average, process_set=process_set)
    my_rank = process_set.rank() if process_set.process_set_id else _basics.rank()
    if my_rank != op.get_attr("root_rank"):  # the op's root is a position in the set
        return reduced * 0
    return reduced


# ---- alltoall --------------------------------------------------------------------------

@_raises_internal_error
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to rank i (equal parts without splits) and
    concatenates what every rank sent here. Returns the tensor, and with `splits` also the
    rows received from each rank."""
    splits_ = (tf.cast(tf.convert_to_tensor(splits), tf.int32) if splits is not None
               else tf.constant([], dtype=tf.int32))
    output, received = _lib.tutti_alltoall(tensor, splits_, process_set=_set_id(process_set),
                                           tensor_name=_op_name("alltoall", tensor, name))
    return (output, received) if splits is not None else output


@_tf_ops.RegisterGradient("TuttiAlltoall")
def _alltoall_grad(op, grad_wrt_output, grad_wrt_received_splits):
    """The gradient of an alltoall: the alltoall of the gradient back with the received
    splits (as Horovod)."""
    grad, _ = alltoall(grad_wrt_output, splits=op.outputs[1],
                       process_set=_temp_process_set(op.get_attr("process_set")))
    return [grad, None]


# ---- reducescatter ---------------------------------------------------------------------

@_raises_internal_error
def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False,
                   process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and gives each rank its part of the first dimension."""
    return _lib.tutti_reducescatter(tensor, reduce_op=_check_op(op, "reducescatter"),
                                    prescale_factor=float(prescale_factor),
                                    postscale_factor=float(postscale_factor),
                                    process_set=_set_id(process_set),
                                    tensor_name=_op_name("reducescatter", tensor, name))


@_tf_ops.RegisterGradient("TuttiReducescatter")
def _reducescatter_grad(op, grad):
    """The gradient of a reducescatter as Horovod defines it: the allgathered gradient,
    times the set's size for Sum, times the scale factors."""
    process_set = _temp_process_set(op.get_attr("process_set"))
    if op.get_attr("reduce_op") == Sum:
        grad *= _set_size(process_set)
    if op.get_attr("prescale_factor") != 1.0:
        grad *= op.get_attr("prescale_factor")
    if op.get_attr("postscale_factor") != 1.0:
        grad *= op.get_attr("postscale_factor")
    return allgather(grad, process_set=process_set)


def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False,
                           process_set=global_process_set, prescale_factor=1.0,
                           postscale_factor=1.0):
    names = [None] * len(tensors) if name is None else ["%s.%d" % (name, i)
                                                         for i in range(len(tensors))]
    return [_reducescatter(t, name=n, op=op, process_set=process_set,
                           prescale_factor=prescale_factor, postscale_factor=postscale_factor)
            for t, n in zip(tensors, names)]


# ---- join and barrier ------------------------------------------------------------------

@_raises_internal_error
def join(process_set=global_process_set):
    """This rank has no more data: until every rank joins it contributes zeros to the other
    ranks' allreduces. Returns the rank that joined last."""
    return _lib.tutti_join(process_set=_set_id(process_set))


@_raises_internal_error
def barrier(process_set=global_process_set):
    """Waits until every rank of the set has reached the barrier."""
    return _lib.tutti_barrier(process_set=_set_id(process_set))


# ---- graph-time topology ops (horovod's size_op, rank_op, ...) ---------------------------

def size_op(process_set_id=0, name=None):
    """The set's size as an int32 tensor."""
    return tf.constant(_set_size(_temp_process_set(process_set_id)), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(_basics.local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(_basics.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(_basics.local_rank(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    included = 1 if process_set_id == 0 else int(_temp_process_set(process_set_id).included())
    return tf.constant(included, dtype=tf.int32, name=name)
