"""tutti.keras on Keras 3 (TensorFlow backend): model.fit on every rank ends with identical
weights; the callbacks and backward_passes_per_step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tutti.keras as hvd
import tutti.tensorflow.keras as hvd_tf_keras


def _model(seed):
    keras.utils.set_random_seed(seed)  # a different start on every rank
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])


def _data(seed, n=32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")


def _same_on_every_rank(weights):
    flat = np.concatenate([np.ravel(w) for w in weights]).astype("float64")
    gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
    for r in range(hvd.size()):
        np.testing.assert_allclose(gathered[r], gathered[0], rtol=0, atol=0)
    return flat


def test_horovod_import_path():
    assert hvd_tf_keras.DistributedOptimizer is hvd.DistributedOptimizer
    assert hvd_tf_keras.callbacks.BroadcastGlobalVariablesCallback is \
        hvd.callbacks.BroadcastGlobalVariablesCallback


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_fit_ends_with_identical_weights(optimizer):
    model = _model(seed=100 + hvd.rank())
    base = getattr(keras.optimizers, optimizer)(learning_rate=0.01)
    opt = hvd.DistributedOptimizer(base)
    assert isinstance(opt, type(base))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = _data(seed=hvd.rank())
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    _same_on_every_rank(model.get_weights())
    # MetricAverageCallback: every rank reports the same averaged loss.
    loss = history.history["loss"][-1]
    gathered = hvd.allgather(tf.constant([loss], tf.float64)).numpy()
    np.testing.assert_allclose(gathered, loss)


def test_gradients_are_averaged_before_apply():
    # One SGD step with lr 1 from zero weights: the update is minus the mean gradient.
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                                   kernel_initializer="zeros")])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)),
                  loss=lambda y, p: tf.reduce_sum(p * y), jit_compile=False)
    x = np.ones((1, 1), "float32")
    y = np.full((1, 1), float(hvd.rank() + 1), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0)
    expected = -sum(range(1, hvd.size() + 1)) / hvd.size()
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [expected], rtol=1e-6)


def test_backward_passes_per_step_sums_locally_then_reduces():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                                   kernel_initializer="zeros")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss=lambda y, p: tf.reduce_sum(p * y), jit_compile=False)
    x = np.ones((2, 1), "float32")
    y = np.full((2, 1), float(hvd.rank() + 1), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, shuffle=False)
    # Two local gradients of rank+1 each, summed (average_aggregated_gradients=False), then
    # averaged over the ranks: one update.
    expected = -2 * sum(range(1, hvd.size() + 1)) / hvd.size()
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [expected], rtol=1e-6)
    _same_on_every_rank(model.get_weights())


def test_learning_rate_warmup():
    model = _model(seed=7)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x, y = _data(seed=1, n=16)
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2,
                                                      steps_per_epoch=2)
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), warmup])
    lrs = history.history["lr"]
    n = hvd.size()
    # Horovod's formula at the last batch of epoch 0: epoch = 0.5 + 1/2
    np.testing.assert_allclose(lrs[0], 0.1 / n * (1.0 * (n - 1) / 2 + 1), rtol=1e-5)
    np.testing.assert_allclose(lrs[-1], lrs[1], rtol=1e-5)  # no change after warmup
    _same_on_every_rank(model.get_weights())


def test_wraps_only_keras_optimizers():
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        hvd.DistributedOptimizer(object())


def test_xla_compiled_model_trains_without_xla():
    """jit_compile=True (what Keras' "auto" picks where TensorFlow sees a GPU): the callbacks
    rebuild the train function without XLA, with a warning, and training works."""
    model = _model(seed=3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
                  jit_compile=True)
    x, y = _data(seed=hvd.rank(), n=16)
    with pytest.warns(UserWarning, match="has an XLA kernel"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert model.jit_compile is False
    _same_on_every_rank(model.get_weights())


def test_load_model_wraps_the_saved_optimizer(tmp_path):
    model = _model(seed=21)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse",
                  jit_compile=False)
    x, y = _data(seed=hvd.rank(), n=16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = str(tmp_path / ("model_rank%d.keras" % hvd.rank()))
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert loaded.optimizer._tutti_distributed
    assert int(loaded.optimizer.iterations.numpy()) == 2
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The loaded optimizer reduces: from the same weights, rank-specific data, every rank
    # ends the same.
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    _same_on_every_rank(loaded.get_weights())
