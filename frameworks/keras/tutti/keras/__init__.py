"""tutti.keras: Tutti for Keras 3 on its TensorFlow, JAX and torch backends, a drop-in for
horovod.keras and horovod.tensorflow.keras.

    import tutti.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

The backend is Keras' (KERAS_BACKEND): its collectives come from tutti.tensorflow, tutti.jax
or tutti.torch, through the small layer in _tensorflow.py, _jax.py or _torch.py; everything
else here and in callbacks.py is the same on every backend. See docs/keras.md.
"""

import importlib

import keras

# Checked before any adapter is imported: on jax or torch TensorFlow is never loaded.
if not keras.__version__.startswith("3."):
    raise ImportError("tutti.keras supports Keras 3 (found keras %s); legacy Keras 2 "
                      "(tf-keras, TF_USE_LEGACY_KERAS=1) is not supported yet "
                      "(docs/keras.md)" % keras.__version__)

# Keras backend -> (the module of its backend layer, the Tutti adapter it stands on).
_BACKENDS = {"tensorflow": ("_tensorflow", "tutti.tensorflow"),
             "jax": ("_jax", "tutti.jax"),
             "torch": ("_torch", "tutti.torch")}
_backend_name = keras.backend.backend()
if _backend_name not in _BACKENDS:
    raise ImportError("tutti.keras runs Keras 3 on the %s backends; this Keras uses the %r "
                      "backend (set KERAS_BACKEND to one of them)"
                      % (", ".join(sorted(_BACKENDS)), _backend_name))
_layer, _adapter = _BACKENDS[_backend_name]
try:
    _backend = importlib.import_module("tutti.keras." + _layer)
except ImportError as e:
    raise ImportError("tutti.keras on the Keras %r backend needs Tutti's %s adapter, which "
                      "does not import here: %s (docs/keras.md)"
                      % (_backend_name, _adapter, e)) from e

# The adapter's collectives and topology (hvd.init, hvd.rank, hvd.allreduce, ...).
globals().update({_name: getattr(_backend, _name) for _name in _backend.EXPORTS})


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
    allreduce_grads = _backend.make_allreduce_grads(
        name or "Distributed%s" % type(optimizer).__name__, device_dense, device_sparse,
        _backend.Compression.none if compression is None else compression, sparse_as_dense,
        _backend.Average if op is None else op, gradient_predivide_factor, groups,
        _backend.global_process_set if process_set is None else process_set)
    base = type(optimizer)
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

    cls = type(base.__name__, (base,), {"_clip_gradients": _clip_gradients,
                                        "_tutti_distributed": True})
    config = optimizer.get_config()
    if steps > 1:
        config["gradient_accumulation_steps"] = steps
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


from tutti.keras import callbacks  # noqa: E402,F401
if _backend_name == "tensorflow":  # elastic Keras stands on tutti.tensorflow.elastic
    from tutti.keras import elastic  # noqa: E402,F401  (docs/elastic.md)
