"""tutti.keras.elastic: elastic Keras training (horovod.keras.elastic and
horovod.tensorflow.keras.elastic; docs/elastic.md), on Keras 3's TensorFlow backend and on
Keras 2:

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, epochs=total_epochs - state.epoch, callbacks=callbacks)

    train(state)
"""

from tutti.keras import keras
from tutti.tensorflow.elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, TensorFlowKerasState, run)


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer (by default the compiled one) and any other
    values given as keyword arguments: TensorFlowKerasState."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of every epoch
    (a commit raises HostsUpdatedInterrupt when hosts changed)."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError("CommitStateCallback: batches_per_commit must be >= 1, got %r"
                             % (batches_per_commit,))
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs=None):
        # From the start again after every reset, the same on every rank.
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the batch fit() is on (set to the index of each batch that
    ends; 0 at the end of an epoch). Where fit() was given steps per epoch, the `steps` it
    reports to callbacks in the first epoch after a reset are those left in the epoch;
    Keras 3 itself still runs the epoch's full count (docs/elastic.md)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of epochs done, counted across resets: each fit()
    after a reset counts its epochs from 0, so call it as Horovod's examples do,
    fit(..., epochs=total_epochs - state.epoch), without initial_epoch."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # One past the epoch that ended: a reset after state.batch went back to 0 does not
        # repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["CommitStateCallback", "HorovodInternalError", "HostsUpdatedInterrupt", "KerasState",
           "ObjectState", "State", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
