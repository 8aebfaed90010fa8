"""tutti.tensorflow.elastic: TensorFlow training that survives lost workers and grows with new
hosts, in horovod.tensorflow.elastic's shape (docs/elastic.md). Run it under tuttirun's
elastic flags:

    import tutti.tensorflow as hvd
    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() every few batches

    train(state)

A collective that fails because a peer died or the job is being reset raises
HorovodInternalError eagerly; from a tf.function (or Keras' fit) it comes out as the
tf.errors.OpError TensorFlow raises, which run() recognizes by its message
(basics.is_recoverable). Other errors pass through run() unchanged.
"""

import numpy as np
import tensorflow as tf

from tutti import _elastic_common
from tutti._elastic_common import HostsUpdatedInterrupt
from tutti.tensorflow import basics, functions, mpi_ops
from tutti.tensorflow.basics import HorovodInternalError


def _any_rank(flag):
    out = mpi_ops._allreduce(tf.constant([flag], dtype=tf.int32),
                             name="tutti.elastic.hosts_updated", op=mpi_ops.Max)
    return int(out.numpy()[0])


def _bcast_object(obj):
    return functions.broadcast_object(obj, root_rank=0, name="tutti.elastic.state")


FRAMEWORK = _elastic_common.Framework(
    "tutti.tensorflow", shutdown=lambda: basics.shutdown(), init=lambda: basics.init(),
    errors=[HorovodInternalError, tf.errors.OpError], recoverable=basics.is_recoverable,
    generation=basics._elastic_generation, hosts_updated=basics._hosts_updated,
    any_rank=_any_rank, bcast_object=_bcast_object)


def run(func):
    """Decorator of the training function `func(state, ...)`: syncs the state from rank 0,
    runs `func`, and when it fails with a recoverable error (a worker died: HorovodInternalError,
    or the same error out of a tf.function) restores the last commit, re-initializes on the
    launcher's next world, syncs and runs it again; on HostsUpdatedInterrupt it
    re-initializes and syncs without a restore."""
    return _elastic_common.run(func, FRAMEWORK)


class State(_elastic_common.State):
    """In-memory state of an elastic job (tutti._elastic_common.State), over
    tutti.tensorflow."""

    _framework = FRAMEWORK


class ObjectState(_elastic_common.ObjectState, State):
    """State of plain Python objects given as keyword arguments (epoch=0, batch=0; see
    tutti._elastic_common.ObjectState), over tutti.tensorflow."""


class _Variables:
    """Saves (host copies), restores and syncs (broadcast from rank 0) the variables that
    `listed()` returns: tf.Variables or Keras 3 variables."""

    def __init__(self, listed):
        self._listed = listed
        self.save()

    def save(self):
        self._saved = [np.array(var.numpy(), copy=True) for var in self._listed()]

    def restore(self):
        variables = self._listed()
        if len(variables) != len(self._saved):
            raise ValueError("tutti.tensorflow.elastic: %d variables to restore but %d were "
                             "saved (variables were created after the last commit)"
                             % (len(variables), len(self._saved)))
        for var, value in zip(variables, self._saved):
            var.assign(value)

    def sync(self):
        functions.broadcast_variables(self._listed(), root_rank=0)
        self.save()


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _build_optimizer(optimizer, model):
    """Creates a Keras 3 optimizer's variables now (Keras does at the first step): every
    worker, a new one included, then saves and syncs the same variables."""
    if optimizer is not None and hasattr(optimizer, "build") and \
            not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)


class _VariablesState(ObjectState):
    """An ObjectState that also saves, restores and syncs `self._variables` (_Variables)."""

    def save(self):
        self._variables.save()
        super().save()

    def restore(self):
        self._variables.restore()
        super().restore()

    def sync(self):
        self._variables.sync()
        super().sync()


class TensorFlowKerasState(_VariablesState):
    """State of a Keras model (built), its optimizer (by default model.optimizer) and any
    other values given as keyword arguments (epoch=0, batch=0).

    The variables of the model and the optimizer are saved as host copies and synced by
    broadcast from rank 0; sync() also saves, so that a restore never returns to a state the
    ranks did not share. An optimizer with no variables yet is built on model's trainable
    variables first. `backend` (Horovod's, for TF1 sessions) is accepted and not used:
    Tutti runs TensorFlow 2 eagerly."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not getattr(model, "built", True):
            raise ValueError("TensorFlowKerasState: the model must be built first (got an "
                             "unbuilt %s; call model.build(input_shape) or run it on a batch)"
                             % type(model).__name__)
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        self.backend = backend
        _build_optimizer(self.optimizer, model)
        self._variables = _Variables(
            lambda: list(self.model.variables) + _optimizer_variables(self.optimizer))
        super().__init__(**kwargs)


class TensorFlowState(_VariablesState):
    """State of a list of tf.Variables and any other values given as keyword arguments:
    the variables saved as host copies and synced by broadcast from rank 0 (sync() also
    saves). `session` (Horovod's, for TF1) is accepted and not used."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            raise ValueError("TensorFlowState: pass the variables to track (TensorFlow 2 "
                             "runs eagerly and has no global variables to default to)")
        self.variables = list(variables)
        self.session = session
        self._variables = _Variables(lambda: self.variables)
        super().__init__(**kwargs)


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "run"]
