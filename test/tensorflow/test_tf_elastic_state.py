"""tutti.tensorflow.elastic and tutti.keras.elastic inside one job (docs/elastic.md): commit,
restore and sync of TensorFlowState and TensorFlowKerasState, the Keras elastic callbacks,
and which errors hvd.elastic.run takes as recoverable. Jobs that lose or gain workers are
test_tf_elastic.py's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tutti.keras as hk
import tutti.tensorflow as hvd


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.set_weights([np.full((3, 2), float(hvd.rank() + 1), np.float32),
                       np.full((2,), float(hvd.rank()), np.float32)])
    return model


def _values(variables):
    return [np.array(v.numpy()) for v in variables]


def test_tensorflow_state_sync_restore_commit():
    v = 1.0 if hvd.rank() == 0 else 2.0
    variables = [tf.Variable(np.full((2, 2), v)), tf.Variable(np.full((2,), v))]
    state = hvd.elastic.TensorFlowState(variables, batch=20 + hvd.rank(), epoch=10)
    state.sync()  # rank 0's values everywhere, and saved
    for value in _values(variables):
        np.testing.assert_array_equal(value, np.ones_like(value))
    assert (state.batch, state.epoch) == (20, 10)

    changed = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.0, 5.0])]
    for var, value in zip(variables, changed):
        var.assign(value)
    state.batch = 21
    state.restore()
    for value in _values(variables):
        np.testing.assert_array_equal(value, np.ones_like(value))
    assert state.batch == 20

    for var, value in zip(variables, changed):
        var.assign(value)
    state.batch = 21
    state.commit()  # outside an elastic job no hosts update comes: no interrupt
    variables[0].assign(np.zeros((2, 2)))
    state.restore()
    for got, want in zip(_values(variables), changed):
        np.testing.assert_array_equal(got, want)
    assert state.batch == 21


def test_keras_state_syncs_and_restores_model_and_optimizer():
    model = _model()
    optimizer = keras.optimizers.Adam(0.1)
    state = hk.elastic.KerasState(model, optimizer, epoch=hvd.rank())
    assert optimizer.built and len(optimizer.variables) > 2  # built for the saves and syncs
    state.sync()
    np.testing.assert_array_equal(model.get_weights()[0], np.ones((3, 2), np.float32))
    assert state.epoch == 0
    synced = _values(model.variables) + _values(optimizer.variables)

    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    assert int(optimizer.iterations.numpy()) == 1
    trained = _values(model.variables) + _values(optimizer.variables)
    assert not np.array_equal(trained[0], synced[0])
    # The gradients were averaged: every rank took the same step.
    gathered = hvd.allgather(tf.reshape(model.variables[0], [1, -1])).numpy()
    assert all(np.array_equal(row, gathered[0]) for row in gathered)

    state.epoch = 5
    state.restore()
    for got, want in zip(_values(model.variables) + _values(optimizer.variables), synced):
        np.testing.assert_array_equal(got, want)
    assert state.epoch == 0 and int(optimizer.iterations.numpy()) == 0

    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    state.commit()
    model.variables[0].assign(np.zeros((3, 2), np.float32))
    state.restore()
    np.testing.assert_array_equal(model.variables[0].numpy(), trained[0])


def test_keras_state_takes_the_compiled_optimizer_and_wants_a_built_model():
    model = _model()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    state = hk.elastic.KerasState(model, batch=0)
    assert state.optimizer is model.optimizer
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="must be built first"):
        hvd.elastic.TensorFlowKerasState(unbuilt)


class _Counting(hvd.elastic.ObjectState):
    def __init__(self, **kwargs):
        self.commits = self.restores = 0
        super().__init__(**kwargs)

    def commit(self):
        self.commits += 1
        super().commit()

    def restore(self):
        self.restores += 1
        super().restore()


def test_keras_elastic_callbacks_commit_and_count():
    state = _Counting(batch=0, epoch=0)
    state.sync()
    model = _model()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
                  jit_compile=False)
    x = np.ones((10, 3), np.float32)
    y = np.zeros((10, 2), np.float32)
    seen = []

    class Seen(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append((state.epoch, state.batch))

    model.fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False,
              callbacks=[hk.elastic.CommitStateCallback(state, batches_per_commit=2),
                         hk.elastic.UpdateBatchStateCallback(state),
                         hk.elastic.UpdateEpochStateCallback(state), Seen()])
    # 5 batches an epoch, a commit every 2 counted across epochs (as Horovod) and one at
    # the end of each epoch: after batches 2, 4, end, 6, 8, 10, end.
    assert state.commits == 7
    assert (state.epoch, state.batch) == (2, 0)
    assert seen[:3] == [(0, 0), (0, 0), (0, 1)] and seen[5] == (1, 0), seen
    # A second fit (as after a reset) counts its epochs on from state.epoch.
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False,
              callbacks=[hk.elastic.UpdateEpochStateCallback(state)])
    assert state.epoch == 3
    with pytest.raises(ValueError, match="batches_per_commit"):
        hk.elastic.CommitStateCallback(state, batches_per_commit=0)


def _op_error(cls, message):
    return cls(None, None, message)


def test_recoverable_op_errors_become_horovod_internal_error():
    marker = hvd.basics.RECOVERABLE_MARKER
    recoverable = _op_error(tf.errors.AbortedError, "tutti.allreduce: rank 1 died" + marker)
    converted = hvd.basics.internal_error(recoverable)
    assert isinstance(converted, hvd.HorovodInternalError)
    assert isinstance(converted, tf.errors.AbortedError) and converted.recoverable
    assert converted.message == recoverable.message
    assert hvd.basics.is_recoverable(recoverable)
    other = _op_error(tf.errors.InvalidArgumentError, "tutti.allreduce: bad shape")
    assert hvd.basics.internal_error(other) is None
    assert not hvd.basics.is_recoverable(other)
    assert hvd.basics.is_recoverable(hvd.HorovodInternalError("raised by a script"))

    @hvd.basics.raises_internal_error
    def fails(error):
        raise error

    with pytest.raises(hvd.HorovodInternalError):
        fails(recoverable)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fails(other)
    assert info.value is other


def test_run_passes_other_errors_through_without_a_restore():
    state = _Counting(batch=0)
    calls = []

    @hvd.elastic.run
    def train(state, error):
        calls.append(state.batch)
        raise error

    other = _op_error(tf.errors.InvalidArgumentError, "tutti.allreduce: bad shape")
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        train(state, other)
    assert info.value is other and calls == [0] and state.restores == 0
    with pytest.raises(KeyError):
        train(state, KeyError("a bug"))
    assert state.restores == 0

    # A runtime error that is not recoverable (outside an elastic job none is).
    not_recoverable = hvd.HorovodInternalError("tutti: aborted")
    not_recoverable.recoverable = False
    with pytest.raises(hvd.HorovodInternalError):
        train(state, not_recoverable)
    assert state.restores == 0
