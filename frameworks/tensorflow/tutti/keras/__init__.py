"""tutti.keras: Tutti for Keras 3 on the TensorFlow backend, a drop-in for horovod.keras and
horovod.tensorflow.keras.

    import tutti.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=..., jit_compile=False)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

See docs/keras.md.
"""

import keras

# Checked before tutti.tensorflow is imported: on another backend TensorFlow is not loaded.
if not keras.__version__.startswith("3."):
    raise ImportError("tutti.keras supports Keras 3 (found keras %s); legacy Keras 2 "
                      "(tf-keras, TF_USE_LEGACY_KERAS=1) is not supported yet "
                      "(docs/keras.md)" % keras.__version__)
if keras.backend.backend() != "tensorflow":
    raise ImportError("tutti.keras runs Keras 3 on the TensorFlow backend; this Keras uses "
                      "the %r backend (set KERAS_BACKEND=tensorflow)" % keras.backend.backend())

from tutti.tensorflow import (  # noqa: F401,E402
    Adasum, Average, Compression, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,
    add_process_set, allgather, allgather_object, allreduce, alltoall, barrier, broadcast,
    broadcast_object, broadcast_variables, cross_rank, cross_size, global_process_set,
    grouped_allreduce, init, is_initialized, join, local_rank, local_size, rank,
    reducescatter, remove_process_set, shutdown, size, start_timeline, stop_timeline)
from tutti.tensorflow import _make_allreduce_grads_fn  # noqa: E402
from tutti.tensorflow import basics as _basics  # noqa: E402


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps any Keras 3 optimizer so that the gradients are reduced (by default averaged)
    over the process set before they are applied (before clipping and weight decay).

    backward_passes_per_step > 1: gradients are accumulated locally (Keras'
    gradient_accumulation_steps) and reduced once every that many steps; summed over the
    steps unless average_aggregated_gradients. Returns a new optimizer of a subclass of the
    given one's class, made from its config.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("tutti.keras.DistributedOptimizer wraps a Keras 3 optimizer "
                         "(keras.optimizers.Optimizer), got %s" % type(optimizer).__name__)
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1, got %r"
                         % (backward_passes_per_step,))
    allreduce_grads = _make_allreduce_grads_fn(
        name or "Distributed%s" % type(optimizer).__name__, device_dense, device_sparse,
        compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set)
    base = type(optimizer)
    steps = int(backward_passes_per_step)

    def _clip_gradients(self, grads):
        # Keras calls this once per update step, with the gradients to apply (the
        # accumulated average when gradient_accumulation_steps is set).
        grads = allreduce_grads(list(grads))
        if steps > 1 and not average_aggregated_gradients:
            grads = [g if g is None else g * steps for g in grads]
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
from tutti.keras import elastic  # noqa: E402,F401  (docs/elastic.md)
