"""tutti.keras: Tutti for Keras 3 on its TensorFlow, JAX and torch backends, and for legacy
Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) on TensorFlow, a drop-in for horovod.keras and
horovod.tensorflow.keras.

    import tutti.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

The backend is Keras' (KERAS_BACKEND): its collectives come from tutti.tensorflow, tutti.jax
or tutti.torch, through the small layer in _tensorflow.py, _jax.py or _torch.py; everything
else here and in callbacks.py is the same on every backend. On Keras 2, _keras2.py is the
layer (tutti.tensorflow's collectives, Horovod's Keras 2 optimizer API). See docs/keras.md.
"""

import importlib
import os

# Legacy Keras 2 as TensorFlow picks it: tf.keras is tf-keras where TF_USE_LEGACY_KERAS is set
# (the values TensorFlow reads), and a `keras` 2.x is Keras 2 itself (TensorFlow <= 2.15).
_KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
if not _KERAS2:
    import keras
    _KERAS2 = keras.__version__.startswith("2.")

if _KERAS2:
    # Keras 2 runs on TensorFlow only: tutti.tensorflow's collectives, _keras2.py's optimizer.
    _backend_name = "tensorflow"
    try:
        _backend = importlib.import_module("tutti.keras._keras2")
    except ImportError as e:
        raise ImportError("tutti.keras on Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) needs "
                          "Tutti's tutti.tensorflow adapter and tf-keras, which do not import "
                          "here: %s (docs/keras.md)" % (e,)) from e
    keras = _backend.keras
else:
    if not keras.__version__.startswith("3."):
        raise ImportError("tutti.keras supports Keras 3 and Keras 2 (found keras %s) "
                          "(docs/keras.md)" % keras.__version__)
    # Keras backend -> (the module of its backend layer, the Tutti adapter it stands on).
    _BACKENDS = {"tensorflow": ("_tensorflow", "tutti.tensorflow"),
                 "jax": ("_jax", "tutti.jax"),
                 "torch": ("_torch", "tutti.torch")}
    _backend_name = keras.backend.backend()
    if _backend_name not in _BACKENDS:
        raise ImportError("tutti.keras runs Keras 3 on the %s backends; this Keras uses the "
                          "%r backend (set KERAS_BACKEND to one of them)"
                          % (", ".join(sorted(_BACKENDS)), _backend_name))
    _layer, _adapter = _BACKENDS[_backend_name]
    try:
        _backend = importlib.import_module("tutti.keras." + _layer)
    except ImportError as e:
        raise ImportError("tutti.keras on the Keras %r backend needs Tutti's %s adapter, "
                          "which does not import here: %s (docs/keras.md)"
                          % (_backend_name, _adapter, e)) from e

# The adapter's collectives and topology (hvd.init, hvd.rank, hvd.allreduce, ...); on Keras 2
# also DistributedOptimizer, PartialDistributedOptimizer and Horovod's value helpers.
globals().update({_name: getattr(_backend, _name) for _name in _backend.EXPORTS})


def _keras3_distributed_class(base, name=None, device_dense="", device_sparse="",
                              compression=None, sparse_as_dense=False,
                              gradient_predivide_factor=1.0, op=None,
                              backward_passes_per_step=1, average_aggregated_gradients=False,
                              groups=None, process_set=None):
    """A subclass of the Keras 3 optimizer class `base`, of the same name, whose gradients
    are reduced over the process set before they are applied (DistributedOptimizer); its
    from_config makes distributed optimizers too (load_model)."""
    allreduce_grads = _backend.make_allreduce_grads(
        name or "Distributed%s" % base.__name__, device_dense, device_sparse,
        _backend.Compression.none if compression is None else compression, sparse_as_dense,
        _backend.Average if op is None else op, gradient_predivide_factor, groups,
        _backend.global_process_set if process_set is None else process_set)
    steps = int(backward_passes_per_step)

    def reduce(grads):
        grads = allreduce_grads(grads)
        if steps > 1 and not average_aggregated_gradients:
            # Keras passes the mean of the steps' gradients; Horovod applies their sum.
            grads = [g if g is None else g * steps for g in grads]
        return grads

    def _clip_gradients(self, grads):
        # Keras calls this with the gradients to apply (with gradient_accumulation_steps, the
        # mean of the accumulated ones). On jax it is called on every step and its result
        # kept on the update steps only: the backend reduces on those steps only.
        grads = _backend.on_update_step(self, steps, reduce, list(grads))
        return base._clip_gradients(self, grads)

    return type(base.__name__, (base,), {"_clip_gradients": _clip_gradients,
                                         "_tutti_distributed": True})


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=None, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=None, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """Wraps any Keras 3 optimizer so that the gradients are reduced (by default averaged)
    over the process set before they are applied (before clipping and weight decay).

    backward_passes_per_step > 1: gradients are accumulated locally (Keras'
    gradient_accumulation_steps) and reduced once every that many steps; summed over the
    steps unless average_aggregated_gradients. Returns a new optimizer of a subclass of the
    given one's class, made from its config. compression, op and process_set default to
    Compression.none, Average and global_process_set of the backend's adapter.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("tutti.keras.DistributedOptimizer wraps a Keras 3 optimizer "
                         "(keras.optimizers.Optimizer), got %s" % type(optimizer).__name__)
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1, got %r"
                         % (backward_passes_per_step,))
    cls = _keras3_distributed_class(
        type(optimizer), name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        groups, process_set)
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


if _KERAS2:
    DistributedOptimizer = _backend.DistributedOptimizer  # noqa: F811


def _subclasses(root):
    """Every subclass of `root`, not Tutti's own distributed ones."""
    found, todo = [], [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if not getattr(sub, "_tutti_distributed", False) and sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None,
               legacy_opts=False):
    """keras.models.load_model(filepath) with the saved optimizer wrapped in a
    DistributedOptimizer (with `compression`), so that training goes on with its state.

    Every optimizer class of Keras' (on Keras 2 tf.keras.optimizers', or with legacy_opts
    tf.keras.optimizers.legacy's) is wrapped by its name, as are `custom_optimizers` (a list
    of Optimizer subclasses); `custom_objects` is passed to Keras as given, after them."""
    if _KERAS2:
        def wrap(cls):
            return _backend.distributed_class(cls, compression=compression)
        root = _backend.optimizer_root(legacy_opts)
    else:
        def wrap(cls):
            return _keras3_distributed_class(cls, compression=compression)
        root = keras.optimizers.Optimizer
    objects = {}
    for cls in _subclasses(root):
        if not cls.__name__.startswith("_"):
            objects[cls.__name__.lower()] = wrap(cls)
            objects.setdefault(cls.__name__, objects[cls.__name__.lower()])
    for cls in custom_optimizers or []:
        objects[cls.__name__] = wrap(cls)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)


from tutti.keras import callbacks  # noqa: E402,F401
if _backend_name == "tensorflow":  # elastic Keras stands on tutti.tensorflow.elastic
    from tutti.keras import elastic  # noqa: E402,F401  (docs/elastic.md)
