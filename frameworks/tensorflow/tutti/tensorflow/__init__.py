"""tutti.tensorflow: Tutti collectives for TensorFlow 2, a drop-in for horovod.tensorflow.

    import tutti.tensorflow as hvd
    hvd.init()
    tape = hvd.DistributedGradientTape(tape)
    hvd.broadcast_variables(model.variables, root_rank=0)

The collectives are TensorFlow ops (asynchronous C++ kernels over Tutti's C API): they run
eagerly, inside tf.function and in graphs. See docs/tensorflow.md.
"""

import os as _os
import sys as _sys

# TensorFlow's start-up chatter (oneDNN notices) is not ours to print: quiet unless asked.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tutti import __version__  # noqa: E402,F401
from tutti.tensorflow.basics import (  # noqa: E402,F401
    HorovodInternalError, ProcessSet, TuttiError, add_process_set, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, nccl_enabled, rank, remove_process_set, rocm_built,
    shutdown, size, start_timeline, stop_timeline)
from tutti.tensorflow.compression import Compression  # noqa: E402,F401
from tutti.tensorflow.mpi_ops import (  # noqa: E402,F401
    Adasum, Average, Max, Min, Product, Sum, _allreduce, _grouped_allreduce,
    _grouped_reducescatter, _reducescatter, allgather, alltoall, barrier, broadcast,
    grouped_allgather, handle_average_backwards_compatibility, join, local_rank_op,
    local_size_op, process_set_included_op, rank_op, size_op)
from tutti.tensorflow.functions import (  # noqa: E402,F401
    allgather_object, broadcast_, broadcast_global_variables, broadcast_object,
    broadcast_object_fn, broadcast_variables)
from tutti.tensorflow.util import _executing_eagerly  # noqa: E402,F401
from tutti.tensorflow import util  # noqa: E402,F401
from tutti.tensorflow import elastic  # noqa: E402,F401  (docs/elastic.md)
from tutti.tensorflow.elastic import HostsUpdatedInterrupt  # noqa: E402,F401

from tutti.tensorflow import basics as _basics  # noqa: E402


def __getattr__(name):
    """SyncBatchNormalization (sync_batch_norm.py) is imported on first use: its base is
    tf.keras' BatchNormalization, Keras 3's or tf-keras' (TF_USE_LEGACY_KERAS=1), and
    tutti.tensorflow imports where tf.keras cannot (that variable set without tf-keras)."""
    if name == "SyncBatchNormalization":
        from tutti.tensorflow.sync_batch_norm import SyncBatchNormalization
        globals()[name] = SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | {"SyncBatchNormalization"})


def _process_set_size(process_set):
    return process_set.size() if process_set.process_set_id else _basics.size()


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduces a tf.Tensor, tf.Variable or tf.IndexedSlices over the process set.

    op: Average (default), Sum, Min, Max or Product; the result is
    postscale_factor * reduce(prescale_factor * tensor). An IndexedSlices is reduced as
    Horovod does: its values and indices are allgathered (values divided by the set's size
    for Average); Sum and Average only, without scale factors.
    """
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError(
                "The Adasum reduction does not support sparse tensors (tutti.tensorflow has "
                "no Adasum); pass sparse_as_dense=True and op=Average")
        if op not in (Sum, Average):
            raise NotImplementedError("Only Sum and Average ops are supported with "
                                      "tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with "
                                      "tf.IndexedSlices")
        with tf.device(device_sparse):
            values = allgather(tensor.values, process_set=process_set,
                               name=None if name is None else name + ".values")
            indices = allgather(tensor.indices, process_set=process_set,
                                name=None if name is None else name + ".indices")
            if op == Average:
                values = values / tf.cast(_process_set_size(process_set), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        reduced = _allreduce(compressed, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, name=None,
                      ignore_name_scope=False):
    """Reduces a list of tensors in one negotiated group (completed together); returns a
    list. IndexedSlices in the list are reduced one by one as allreduce() does."""
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out = list(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = allreduce(t, op=op, process_set=process_set,
                               name=None if name is None else "%s.%d" % (name, i))
    if dense:
        with tf.device(device_dense):
            pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
            reduced = _grouped_allreduce([p[0] for p in pairs], op=op, name=name,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor,
                                         process_set=process_set)
            for i, r, (_, ctx) in zip(dense, reduced, pairs):
                out[i] = compression.decompress(r, ctx)
    return out


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set (default: average) and returns this rank's part of the
    first dimension (the first ranks get one row more when it does not divide evenly)."""
    with tf.device(device_dense):
        compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
        reduced = _reducescatter(compressed, op=op, name=name, process_set=process_set,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor)
        return compression.decompress(reduced, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          name=None, process_set=global_process_set, ignore_name_scope=False,
                          prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor of the list."""
    names = [None] * len(tensors) if name is None else ["%s.%d" % (name, i)
                                                         for i in range(len(tensors))]
    return [reducescatter(t, device_dense, compression, op, n, process_set,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)
            for t, n in zip(tensors, names)]


def _var_key(var):
    """A hashable key for a tf.Variable or a Keras 3 variable (which has no ref())."""
    return var.ref() if hasattr(var, "ref") else id(var)


def _make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense,
                             op, gradient_predivide_factor, groups, process_set):
    """fn(grads, vars=None) -> the gradients reduced over the set (None stays None)."""
    if op == Adasum:
        raise NotImplementedError("%s: the Adasum reduction is not supported by "
                                  "tutti.tensorflow (docs/tensorflow.md)" % name)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")

    def allreduce_grads(grads, vars=None, use_generic_names=False):  # noqa: A002
        grads = list(grads)
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        index = [i for i, g in enumerate(grads) if g is not None]
        if not index or (process_set.process_set_id and not process_set.included()):
            return grads  # a rank outside the set keeps its own gradients (as Horovod)
        prescale, postscale, reduce_op = 1.0, 1.0, op
        if gradient_predivide_factor != 1.0:
            reduce_op = Sum
            prescale = 1.0 / gradient_predivide_factor
            postscale = gradient_predivide_factor / _process_set_size(process_set)
        reduced = grouped_allreduce([grads[i] for i in index], device_dense=device_dense,
                                    device_sparse=device_sparse, compression=compression,
                                    op=reduce_op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set)
        out = list(grads)
        for i, r in zip(index, reduced):
            out[i] = r
        return out

    return allreduce_grads


def _reduce_except_local(allreduce_grads, grads, variables, local_keys, scale_local_gradients,
                         process_set):
    """The gradients (a list, one per variable) with those of variables whose _var_key is not
    in local_keys reduced by allreduce_grads (one call, as _make_allreduce_grads_fn's); the
    local ones stay local, divided by the set's size when scale_local_gradients. Shared by
    DistributedGradientTape and the DistributedOptimizers (TF1-style and Keras 2)."""
    at = [i for i, v in enumerate(variables) if _var_key(v) not in local_keys]
    out = list(grads)
    for i, g in zip(at, allreduce_grads([grads[i] for i in at], [variables[i] for i in at])):
        out[i] = g
    if scale_local_gradients and local_keys:
        n = _process_set_size(process_set)
        for i, v in enumerate(variables):
            g = out[i]
            if _var_key(v) in local_keys and g is not None:
                out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                          if isinstance(g, tf.IndexedSlices) else g / n)
    return out


def _keras_layer_types():
    """The Layer classes of the Kerases this process has imported: `keras` (Keras 3) and
    tf-keras (tf.keras under TF_USE_LEGACY_KERAS=1). A layer's Keras is imported before the
    layer exists, so a layer is an instance of one of these."""
    found = []
    for module in ("keras", "tf_keras"):
        layers = getattr(_sys.modules.get(module), "layers", None)
        if layers is not None:
            found.append(layers.Layer)
    return tuple(found)


def _register_local_layers(who, local_layers, register):
    """register(var) for every trainable weight of `local_layers`: None, a Keras layer (of
    either Keras, _keras_layer_types) or a list (any iterable) of them. Shared by
    PartialDistributedGradientTape (register: register_local_source) and Keras 2's
    PartialDistributedOptimizer (register_local_var); anything else is a ValueError that
    names `who`, what it expected and what it got, before anything is registered."""
    def describe(obj):
        name = getattr(obj, "name", None)
        return "of type %s%s" % (type(obj).__name__, " named %r" % name
                                 if isinstance(name, str) else "")

    layer_types = _keras_layer_types()
    expected = ("%s: local_layers must be a Keras layer or a list of Keras layers "
                "(keras.layers.Layer, or tf.keras.layers.Layer of tf-keras); got " % who)
    if local_layers is None:
        layers = []
    elif isinstance(local_layers, layer_types):
        layers = [local_layers]
    elif isinstance(local_layers, (str, bytes)) or not hasattr(local_layers, "__iter__"):
        raise ValueError(expected + "an object " + describe(local_layers))
    else:
        layers = list(local_layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, layer_types):
            raise ValueError(expected + "item %d %s" % (i, describe(layer)))
    for layer in layers:
        for var in layer.trainable_weights:
            register(var)


class _DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape whose gradient() averages the gradients over the process set."""

    def __init__(self, tape, device_dense, device_sparse, compression, sparse_as_dense, op,
                 gradient_predivide_factor, groups, persistent=False,
                 watch_accessed_variables=True, process_set=global_process_set,
                 scale_local_gradients=True):
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._allreduce_grads = _make_allreduce_grads_fn(
            "DistributedGradientTape", device_dense, device_sparse, compression,
            sparse_as_dense, op, gradient_predivide_factor, groups, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources = set()

    def register_local_source(self, source):
        """Gradients of `source` stay local (not reduced; divided by the set's size when
        scale_local_gradients)."""
        self._local_sources.add(_var_key(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        gradients = super(self.__class__, self).gradient(target, sources, output_gradients)
        out = _reduce_except_local(
            self._allreduce_grads, tf.nest.flatten(gradients, expand_composites=False),
            tf.nest.flatten(sources), self._local_sources, self.scale_local_gradients,
            self.process_set)
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """gradient()'s results split in two lists of (source, gradient) pairs, in the order
        of `sources`: the local sources' (register_local_source), then the reduced ones'."""
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients,
                                              use_generic_names))
        local, reduced = [], []
        for source, grad in zip(tf.nest.flatten(sources), grads):
            (local if _var_key(source) in self._local_sources else reduced).append((source, grad))
        return local, reduced


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape so that gradient() returns the gradients reduced (by default
    averaged) over the process set, in one negotiated group. IndexedSlices gradients are
    allgathered unless sparse_as_dense. num_groups/groups are accepted; every dense gradient
    travels in one group (Tutti fuses them)."""
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups >= 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_DistributedGradientTape.__dict__))
    return cls(gradtape._tape, device_dense, device_sparse, compression, sparse_as_dense, op,
               gradient_predivide_factor, groups, gradtape._persistent,
               gradtape._watch_accessed_variables, process_set=process_set,
               scale_local_gradients=scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, local_layers=None,
                                   process_set=global_process_set, scale_local_gradients=True):
    """DistributedGradientTape whose gradients of the trainable weights of `local_layers`
    (a Keras layer or a list of them) stay local: not reduced, divided by the set's size
    when scale_local_gradients (horovod.tensorflow.PartialDistributedGradientTape)."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    _register_local_layers("tutti.tensorflow.PartialDistributedGradientTape", local_layers,
                           tape.register_local_source)
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Wraps an optimizer so that the gradients are reduced over the process set before they
    are applied: a Keras optimizer (see tutti.keras.DistributedOptimizer), or a TF1-style
    tf.compat.v1.train.Optimizer, whose compute_gradients() then returns the reduced
    gradients (horovod.tensorflow's _DistributedOptimizer)."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from tutti.tensorflow.legacy_optimizer import _LegacyDistributedOptimizer
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1, got %r"
                             % (backward_passes_per_step,))
        name = name or "Distributed%s" % type(optimizer).__name__
        return _LegacyDistributedOptimizer(
            optimizer, name, use_locking,
            _make_allreduce_grads_fn(name, device_dense, device_sparse, compression,
                                     sparse_as_dense, op, gradient_predivide_factor, groups,
                                     process_set),
            process_set, sparse_as_dense, backward_passes_per_step,
            average_aggregated_gradients, scale_local_gradients)
    from tutti.keras import DistributedOptimizer as _keras_distributed
    return _keras_distributed(optimizer, name=name, device_dense=device_dense,
                              device_sparse=device_sparse, compression=compression,
                              sparse_as_dense=sparse_as_dense,
                              backward_passes_per_step=backward_passes_per_step, op=op,
                              gradient_predivide_factor=gradient_predivide_factor,
                              average_aggregated_gradients=average_aggregated_gradients,
                              num_groups=num_groups, groups=groups, process_set=process_set,
                              scale_local_gradients=scale_local_gradients)
