"""Keras callbacks for data-parallel training (horovod.keras.callbacks), the same on every
Keras 3 backend and on Keras 2: the collectives come from the backend layer tutti.keras
picked, the Callback base class from the Keras it runs (tutti.keras.keras)."""

import numpy as np

from tutti.keras import _KERAS2, _backend, keras


def _optimizer_variables(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return []
    variables = optimizer.variables  # a method on Keras 2's optimizers.legacy
    return list(variables() if callable(variables) else variables)


def _key(variable):
    """A hashable key for a variable (tf.Variable's ref(), else its identity)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from the weights and optimizer state of `root_rank`: broadcasts
    them when training begins, and again after the first batch (which builds what a lazily
    built optimizer had not), as Horovod does. `local_variables` (model or optimizer
    variables) keep their values on every rank."""

    def __init__(self, root_rank, device="", process_set=None, local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = _backend.global_process_set if process_set is None else process_set
        self.local_variables = {_key(v) for v in local_variables or []}
        self.broadcast_done = False

    def _broadcast(self):
        _backend.sync_model(self.model)
        for variables in (self.model.variables, _optimizer_variables(self.model)):
            variables = [v for v in variables if _key(v) not in self.local_variables]
            if variables:
                _backend.broadcast_variables(variables, self.root_rank,
                                             process_set=self.process_set)

    def on_train_begin(self, logs=None):
        _backend.prepare_model(self.model)
        self._broadcast()

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        self._broadcast()
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the epoch's metrics (logs) over the ranks at the end of every epoch, so that
    every rank reports (and later callbacks see) the same values. Put it before callbacks
    that read metrics (ReduceLROnPlateau, checkpoints)."""

    def __init__(self, device="", process_set=None):
        super().__init__()
        self.process_set = _backend.global_process_set if process_set is None else process_set

    def on_train_begin(self, logs=None):
        _backend.prepare_model(self.model)

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = [key for key in sorted(logs)
                if isinstance(logs[key], (int, float, np.floating, np.integer)) or (
                    hasattr(logs[key], "shape") and np.ndim(logs[key]) == 0)]
        if not keys:
            return
        values = np.array([float(logs[key]) for key in keys], np.float64)
        averaged = _backend.average_scalars(values, "keras.metric_average",
                                            self.process_set)
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


def _set_lr(model, value):
    # On jax, during fit the optimizer's learning rate lives in the trainer's state: written
    # back first, the assigned value is what the next step reads.
    _backend.sync_model(model)
    optimizer = model.optimizer
    lr = optimizer.learning_rate
    if hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


def _get_lr(optimizer):
    if _KERAS2:
        return float(keras.backend.get_value(optimizer.learning_rate))
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) between start_epoch and
    end_epoch; with steps_per_epoch, epoch is fractional and updated every batch
    (staircase=False)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        _set_lr(self.model, self.initial_lr * self.multiplier(epoch))

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust(epoch)

    def on_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        if not self.steps_per_epoch:
            raise ValueError("LearningRateScheduleCallback(staircase=False) needs "
                             "steps_per_epoch")
        self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from initial_lr / size() to initial_lr over warmup_epochs
    (Goyal et al.), per batch when steps_per_epoch is given (Horovod's formula:
    lr = initial_lr * (epoch * (size - 1) / warmup_epochs + 1) / size)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch if self.steps_per_epoch else 0.0
            n = _backend.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=steps_per_epoch is None,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, _get_lr(self.model.optimizer)))
