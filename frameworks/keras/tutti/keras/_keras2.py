"""tutti.keras on legacy Keras 2: tf-keras (`tf.keras` with TF_USE_LEGACY_KERAS=1), or a
`keras` 2.x next to TensorFlow 2.15 and older. The collectives are tutti.tensorflow's (through
the TensorFlow backend layer, _tensorflow.py); what is Keras-2 specific lives here: the
DistributedOptimizer (horovod.tensorflow.keras' way: the gradients are reduced where the
optimizer computes them, in compute_gradients / _compute_gradients / get_gradients),
PartialDistributedOptimizer, and Horovod's value helpers (allreduce, allgather, broadcast of
values; broadcast_global_variables). The callbacks, elastic and load_model are shared with
Keras 3 (callbacks.py, elastic.py, __init__.py) over `keras` of this module."""

import tensorflow as tf

import tutti.tensorflow as _tf
from tutti.keras import _tensorflow
from tutti.keras._tensorflow import (  # noqa: F401
    Adasum, Average, Compression, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,
    add_process_set, allgather_object, alltoall, average_scalars, barrier, broadcast_object,
    broadcast_variables, cross_rank, cross_size, global_process_set, grouped_allreduce, init,
    is_initialized, join, local_rank, local_size, prepare_model, rank, remove_process_set,
    shutdown, size, start_timeline, stop_timeline, sync_model)
from tutti.tensorflow.legacy_optimizer import _GradientAggregation

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1


def _keras_version(module):
    version = getattr(module, "__version__", None)  # Keras 2 and 3 as `keras`
    if version is None and module.layers.Layer.__module__.startswith("tf_keras."):
        import tf_keras  # its API module, tf.keras, has no __version__
        version = tf_keras.__version__
    return str(version)


if not _keras_version(keras).startswith("2."):
    raise ImportError("tutti.keras on Keras 2: tf.keras is Keras %s, not Keras 2 (install "
                      "tf-keras matching TensorFlow %s with `pip install --no-deps "
                      "tf-keras==<version>` and set TF_USE_LEGACY_KERAS=1 before TensorFlow "
                      "is imported; docs/keras.md)" % (_keras_version(keras), tf.__version__))

# What `tutti.keras` re-exports on Keras 2.
EXPORTS = [name for name in _tensorflow.EXPORTS
           if name not in ("allreduce", "allgather", "broadcast", "reducescatter")] + [
    "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce",
    "broadcast", "broadcast_global_variables", "reducescatter"]


def _eval(result):
    """A collective's result: the tensor eagerly, its value in a TF1 graph (Keras' session),
    as horovod.keras returns them."""
    if tf.executing_eagerly():
        return result
    return tf.compat.v1.keras.backend.get_session().run(result)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """The reduction (default: Average) over all ranks of a tensor-compatible value."""
    return _eval(_tf.allreduce(tf.constant(value, name=name), average=average,
                               prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, op=op,
                               compression=compression))


def allgather(value, name=None):
    """The concatenation over all ranks (first dimension) of a tensor-compatible value."""
    return _eval(_tf.allgather(tf.constant(value, name=name)))


def broadcast(value, root_rank, name=None):
    """The value of `root_rank`, on every rank."""
    return _eval(_tf.broadcast(tf.constant(value, name=name), root_rank))


def reducescatter(value, name=None, op=Average):
    """This rank's part of the reduction of a tensor-compatible value over all ranks."""
    return _eval(_tf.reducescatter(tf.constant(value, name=name), op=op))


def broadcast_global_variables(root_rank):
    """TF1 graphs (Keras' session): broadcasts every global variable from `root_rank`.
    Eagerly it raises RuntimeError, as horovod.keras: use BroadcastGlobalVariablesCallback
    or broadcast_variables."""
    return _eval(_tf.broadcast_global_variables(root_rank))


def _tracked_variable(name, shape, dtype):
    """A non-trainable variable of zeros, created outside any tf.function being traced
    (Keras' train function); in a TF1 graph, initialized in Keras' session."""
    with tf.init_scope():
        var = tf.Variable(tf.zeros(shape, dtype), trainable=False,
                          name="tutti_aggregation_" + name)
        if not tf.executing_eagerly():
            tf.compat.v1.keras.backend.get_session().run(var.initializer)
    return var


def distributed_class(base, name=None, device_dense="", device_sparse="",
                      compression=Compression.none, sparse_as_dense=False,
                      gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                      average_aggregated_gradients=False, groups=None,
                      process_set=global_process_set, scale_local_gradients=True):
    """A subclass of the Keras 2 optimizer class `base`, of the same name (a saved model
    loads without Tutti), whose gradients are reduced over the process set where it computes
    them. Its from_config makes distributed optimizers too (load_model)."""
    allreduce_grads = _tf._make_allreduce_grads_fn(
        name or "Distributed%s" % base.__name__, device_dense, device_sparse,
        Compression.none if compression is None else compression,
        sparse_as_dense, op, gradient_predivide_factor, groups, process_set)
    steps = int(backward_passes_per_step)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._agg_helper = None
        if steps > 1:
            self._agg_helper = _GradientAggregation(steps, average_aggregated_gradients,
                                                    self._reduce_now, _tracked_variable)

    def register_local_var(self, var):
        """The gradient of `var` stays local: not reduced (divided by the set's size when
        scale_local_gradients)."""
        self._local_vars.add(_tf._var_key(var))

    def _reduce_now(self, grads, variables):
        return _tf._reduce_except_local(allreduce_grads, list(grads), list(variables),
                                        self._local_vars, self.scale_local_gradients,
                                        self.process_set)

    def _allreduce(self, grads, variables):
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(list(grads), list(variables))
        return self._reduce_now(grads, variables)

    def compute_gradients(self, loss, var_list, tape=None):
        """The gradients of `loss`, reduced over the process set: [(gradient, variable)]."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if hasattr(base, "_compute_gradients"):  # optimizers.legacy (OptimizerV2)
            grads_and_vars = base._compute_gradients(self, loss, var_list, grad_loss=grad_loss,
                                                     tape=tape)
        else:
            grads_and_vars = base.compute_gradients(self, loss, var_list, tape=tape)
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._allreduce(grads, variables), variables))

    def get_gradients(self, loss, params):
        """TF1-graph Keras (optimizers.legacy): the gradients, reduced over the process set."""
        return self._allreduce(base.get_gradients(self, loss, params), params)

    def apply_gradients(self, *args, **kwargs):
        if self._agg_helper is None:
            return base.apply_gradients(self, *args, **kwargs)
        args = list(args)
        if args and not isinstance(args[0], (list, tuple)):
            args[0] = list(args[0])  # a zip: read once per branch of the cond
        return self._agg_helper.apply_gradients(
            lambda: _as_op(base.apply_gradients(self, *args, **kwargs)),
            lambda: _as_op(self.iterations.assign_add(1)))

    attrs = {"__init__": __init__, "register_local_var": register_local_var,
             "_reduce_now": _reduce_now, "_allreduce": _allreduce,
             "compute_gradients": compute_gradients, "_compute_gradients": _compute_gradients,
             "apply_gradients": apply_gradients, "_tutti_distributed": True}
    if hasattr(base, "get_gradients"):
        attrs["get_gradients"] = get_gradients
    return type(base.__name__, (base,), attrs)


def _as_op(result):
    """An op or tensor to order after (None for a variable, which tf.function and eager
    execution order by themselves)."""
    return result if isinstance(result, (tf.Tensor, tf.Operation)) else None


def _check_optimizer(optimizer, what):
    kinds = tuple(k for k in (getattr(keras.optimizers, "Optimizer", None),
                              getattr(getattr(keras.optimizers, "legacy", None), "Optimizer",
                                      None)) if k is not None)
    if not isinstance(optimizer, kinds):
        raise ValueError("tutti.keras.%s wraps a Keras 2 optimizer (tf.keras.optimizers."
                         "Optimizer or tf.keras.optimizers.legacy.Optimizer), got %s"
                         % (what, type(optimizer).__name__))


def _check_arguments(op, gradient_predivide_factor, groups, backward_passes_per_step):
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1, got %r"
                         % (backward_passes_per_step,))


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras 2 optimizer (tf.keras.optimizers.*, or .legacy.*) so that the gradients
    are reduced (Average or Sum) over the process set before they are applied: a new
    optimizer of a subclass of its class, made from its config.

    backward_passes_per_step > 1: the gradients are summed locally (averaged with
    average_aggregated_gradients) and reduced and applied once every that many steps;
    `iterations` counts every step. register_local_var(var) keeps a variable's gradient local
    (see PartialDistributedOptimizer)."""
    _check_optimizer(optimizer, "DistributedOptimizer")
    if num_groups and groups is None:
        groups = num_groups
    _check_arguments(op, gradient_predivide_factor, groups, backward_passes_per_step)
    cls = distributed_class(type(optimizer), name, device_dense, device_sparse,
                            compression, sparse_as_dense,
                            gradient_predivide_factor, op, backward_passes_per_step,
                            average_aggregated_gradients, groups, process_set,
                            scale_local_gradients)
    return cls.from_config(optimizer.get_config())


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average, groups=None,
                                process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose gradients of the trainable weights of `local_layers` (a
    Keras layer or a list of them) stay local: not reduced, divided by the set's size when
    scale_local_gradients (as Horovod). Without local_layers it is DistributedOptimizer."""
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense,
                               device_sparse=device_sparse, compression=compression,
                               sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    _tf._register_local_layers("tutti.keras.PartialDistributedOptimizer", local_layers,
                               opt.register_local_var)
    return opt


def optimizer_root(legacy_opts):
    """The class whose subclasses load_model wraps: tf.keras.optimizers.Optimizer, or with
    legacy_opts tf.keras.optimizers.legacy.Optimizer (as horovod.tensorflow.keras)."""
    return keras.optimizers.legacy.Optimizer if legacy_opts else keras.optimizers.Optimizer
