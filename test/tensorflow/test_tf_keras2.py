"""tutti.keras on legacy Keras 2 (tf-keras with TF_USE_LEGACY_KERAS=1; CTest
tensorflow_keras2_gloo_2 runs this file alone, so that no Keras 3 test shares its process):
fit ends with identical weights equal to the single-process reference, backward_passes_per_step,
the callbacks, load_model, PartialDistributedOptimizer, Horovod's value helpers, and
tutti.tensorflow.SyncBatchNormalization as a tf-keras layer."""

import os

import numpy as np
import pytest

if os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True"):
    pytest.skip("Keras 2 tests: run with TF_USE_LEGACY_KERAS=1 (CTest "
                "tensorflow_keras2_gloo_2)", allow_module_level=True)

import tensorflow as tf  # noqa: E402

keras = tf.keras
if not keras.layers.Layer.__module__.startswith("tf_keras."):
    pytest.fail("TF_USE_LEGACY_KERAS=1 but tf.keras.layers.Layer is %s's: tf-keras is missing "
                "(scripts/setup.sh installs it)" % keras.layers.Layer.__module__, pytrace=False)

import tutti.keras as hvd  # noqa: E402
import tutti.tensorflow as hvd_tf  # noqa: E402
import tutti.tensorflow.keras as hvd_tf_keras  # noqa: E402


def _gathered(values):
    """allgather of a float64 vector: one row per rank."""
    flat = np.asarray(values, np.float64).ravel()
    return hvd.allgather(flat[None, :]).numpy()


def _same_on_every_rank(weights):
    flat = np.concatenate([np.ravel(w) for w in weights]).astype(np.float64)
    rows = _gathered(flat)
    for r in range(hvd.size()):
        np.testing.assert_array_equal(rows[r], flat, err_msg="rank %d differs from rank %d"
                                      % (r, hvd.rank()))
    return flat


def _data(rank, n=16):
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x.sum(axis=1, keepdims=True) * 0.5 + rank).astype(np.float32)


def _model(seed):
    tf.keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
                             keras.layers.Dense(1)])


def test_keras2_and_import_paths():
    assert hvd._KERAS2
    assert hvd.keras is tf.keras and hvd._backend._keras_version(hvd.keras).startswith("2.")
    assert hvd_tf_keras.DistributedOptimizer is hvd.DistributedOptimizer
    assert hvd_tf_keras.PartialDistributedOptimizer is hvd.PartialDistributedOptimizer
    assert hvd_tf_keras.load_model is hvd.load_model
    assert issubclass(hvd.callbacks.BroadcastGlobalVariablesCallback, keras.callbacks.Callback)
    assert issubclass(hvd.elastic.CommitStateCallback, keras.callbacks.Callback)
    with pytest.raises(ValueError, match="wraps a Keras 2 optimizer"):
        hvd.DistributedOptimizer(object())


@pytest.mark.parametrize("legacy", [False, True], ids=["optimizers", "optimizers.legacy"])
def test_fit_equals_single_process_reference(legacy):
    """Same start on every rank (seeded), rank-specific data: after fit, every rank holds the
    weights of plain SGD on the mean of the ranks' gradients, computed here in one process."""
    lr, batch, n = 0.05, 4, 16
    sgd = keras.optimizers.legacy.SGD if legacy else keras.optimizers.SGD
    model = _model(seed=7)
    reference = _model(seed=7)
    opt = hvd.DistributedOptimizer(sgd(lr))
    assert isinstance(opt, sgd) and type(opt).__name__ == "SGD"
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(hvd.rank(), n)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    weights = _same_on_every_rank(model.get_weights())

    data = [_data(r, n) for r in range(hvd.size())]
    loss_fn = keras.losses.MeanSquaredError()
    for start in range(0, n, batch):
        grads = []
        for xr, yr in data:
            with tf.GradientTape() as tape:
                loss = loss_fn(yr[start:start + batch], reference(xr[start:start + batch]))
            grads.append(tape.gradient(loss, reference.trainable_variables))
        for var, *per_rank in zip(reference.trainable_variables, *grads):
            var.assign_sub(lr * tf.add_n(per_rank) / len(per_rank))
    expected = np.concatenate([np.ravel(w) for w in reference.get_weights()])
    np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)


def _linear_model():
    # loss = sum(p * y) with p = w * x, x = 1: the gradient of w is this rank's y.
    model = keras.Sequential([keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                                                 input_shape=(1,))])
    return model, (lambda y, p: tf.reduce_sum(p * y))


@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step(average):
    model, loss = _linear_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss=loss)
    x = np.ones((3, 1), np.float32)
    y = np.full((3, 1), float(hvd.rank() + 1), np.float32)
    model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
    # Batches 1 and 2: their local gradients (rank + 1 each) summed (or averaged), averaged
    # over the ranks, applied once; batch 3 only accumulates.
    mean = sum(range(1, hvd.size() + 1)) / hvd.size()
    expected = -mean * (1 if average else 2)
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [expected], rtol=1e-6)
    assert int(opt.iterations.numpy()) == 3  # every batch counts
    assert int(opt._agg_helper.counter.numpy()) == 1


def test_callbacks_broadcast_warmup_and_metric_average():
    model = _model(seed=100 + hvd.rank())  # a different start on every rank
    root = hvd.size() - 1
    root_start = _gathered(np.concatenate([np.ravel(w) for w in model.get_weights()]))[root]
    local = model.layers[1].kernel
    local_start = local.numpy().copy()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.0))  # lr 0 until the warm-up
    model.compile(optimizer=opt, loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((logs["lr"], logs["loss"]))

    x, y = _data(hvd.rank(), 8)
    initial_lr = 0.0  # the weights must stay root's (and the local kernel this rank's)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=[local]),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=2),
        Record()])
    parts = np.split(root_start, np.cumsum([np.size(w) for w in model.weights])[:-1])
    for var, root_value in zip(model.weights, parts):
        if var is local:  # kept this rank's
            np.testing.assert_array_equal(var.numpy(), local_start)
        else:
            np.testing.assert_array_equal(var.numpy().ravel(), root_value, err_msg=var.name)
    # MetricAverageCallback: the same loss on every rank.
    losses = _gathered(history.history["loss"])
    np.testing.assert_array_equal(losses, np.repeat(losses[:1], hvd.size(), axis=0))
    assert [lr for lr, _ in seen] == [0.0, 0.0]


def test_warmup_learning_rates_follow_horovods_formula():
    model = _model(seed=3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    x, y = _data(hvd.rank(), 8)
    lrs = []

    class Record(keras.callbacks.Callback):
        def on_batch_begin(self, batch, logs=None):
            lrs.append(float(keras.backend.get_value(self.model.optimizer.learning_rate)))

    model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2,
                                                 steps_per_epoch=2),
        Record()])
    n = hvd.size()
    expected = [0.4 / n * ((e + b / 2 + 0.5) * (n - 1) / 2 + 1)
                for e in range(2) for b in range(2)]
    np.testing.assert_allclose(lrs, expected, rtol=1e-6)


@pytest.mark.parametrize("legacy_opts", [False, True])
def test_load_model_round_trip(tmp_path, legacy_opts):
    adam = keras.optimizers.legacy.Adam if legacy_opts else keras.optimizers.Adam
    model = _model(seed=11)
    model.compile(optimizer=hvd.DistributedOptimizer(adam(0.01)), loss="mse")
    x, y = _data(hvd.rank(), 8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    path = str(tmp_path / ("model_rank%d.h5" % hvd.rank()))
    model.save(path)
    loaded = hvd.load_model(path, legacy_opts=legacy_opts)
    assert isinstance(loaded.optimizer, adam) and loaded.optimizer._tutti_distributed
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(loaded.optimizer.iterations.numpy()) == 2
    # Training goes on distributed: every rank ends the same.
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    _same_on_every_rank(loaded.get_weights())


def test_load_model_custom_optimizers_and_objects(tmp_path):
    class TuttiTestSGD(keras.optimizers.SGD):
        pass

    def custom_loss(y, p):
        return tf.reduce_mean(tf.square(y - p))

    model = _model(seed=12)
    model.compile(optimizer=hvd.DistributedOptimizer(TuttiTestSGD(0.01)), loss=custom_loss)
    x, y = _data(hvd.rank(), 8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / ("custom_rank%d.h5" % hvd.rank()))
    model.save(path)
    loaded = hvd.load_model(path, custom_optimizers=[TuttiTestSGD],
                            custom_objects={"custom_loss": custom_loss},
                            compression=hvd.Compression.fp16)
    assert isinstance(loaded.optimizer, TuttiTestSGD)
    assert loaded.optimizer._tutti_distributed
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    _same_on_every_rank(loaded.get_weights())


def test_partial_distributed_optimizer_keeps_local_gradients_local():
    tf.keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,)), keras.layers.Dense(2)])
    x, y = _data(hvd.rank(), 4)
    y = np.repeat(y, 2, axis=1)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    local_grads = tape.gradient(loss, model.trainable_weights)
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.Adam(),
                                          local_layers=[model.layers[0]])
    reduced = dict((v.ref(), g) for g, v in
                   opt._compute_gradients(loss, model.trainable_weights, tape=tape))
    local_refs = {v.ref() for v in model.layers[0].trainable_weights}
    n = hvd.size()
    for var, grad in zip(model.trainable_weights, local_grads):
        got = reduced[var.ref()].numpy()
        if var.ref() in local_refs:
            # Not reduced: this rank's gradient, divided by the set's size (as Horovod).
            np.testing.assert_allclose(got, grad.numpy() / n, rtol=1e-6)
        else:
            mean = _gathered(grad.numpy()).mean(axis=0).reshape(grad.shape)
            np.testing.assert_allclose(got, mean, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="PartialDistributedOptimizer: local_layers must be a "
                       "Keras layer or a list of Keras layers .*; got item 0 of type object"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), local_layers=[object()])
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), local_layers=model.layers[1])
    assert opt._local_vars == {v.ref() for v in model.layers[1].trainable_weights}


def _bn_batch(rank):
    """Rank r holds r + 2 rows (a different batch size on every rank) of 3 steps of 4
    channels."""
    rng = np.random.default_rng(20 + rank)
    return rng.normal(loc=rank, scale=1.0 + rank, size=(rank + 2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf_function"])
def test_sync_batch_norm_is_keras2_and_matches_the_global_batch(in_function):
    """tutti.tensorflow.SyncBatchNormalization on Keras 2 is a tf-keras layer; its output, the
    gradient of its input and its moving statistics are those of tf-keras'
    BatchNormalization over every rank's batch put together."""
    import tf_keras
    assert issubclass(hvd_tf.SyncBatchNormalization, tf_keras.layers.BatchNormalization)
    xs = [_bn_batch(r) for r in range(hvd.size())]
    w = tf.constant(np.linspace(-1, 1, 12).reshape(3, 4), tf.float32)

    def run(layer, x):
        layer.build(x.shape)  # the variables, outside the tf.function

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = layer(x, training=True)
                loss = tf.reduce_sum(out * w)
            return out, tape.gradient(loss, x)

        return (tf.function(step) if in_function else step)(x)

    full = tf.constant(np.concatenate(xs))
    bn = keras.layers.BatchNormalization(momentum=0.5)
    out_ref, dx_ref = run(bn, full)
    start = sum(x.shape[0] for x in xs[:hvd.rank()])
    stop = start + xs[hvd.rank()].shape[0]

    x = tf.constant(xs[hvd.rank()])
    sync_bn = hvd_tf.SyncBatchNormalization(momentum=0.5)
    out, dx = run(sync_bn, x)
    np.testing.assert_allclose(out.numpy(), out_ref.numpy()[start:stop], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx.numpy(), dx_ref.numpy()[start:stop], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sync_bn.moving_variance.numpy(), bn.moving_variance.numpy(),
                               rtol=1e-4, atol=1e-5)
    # Inference uses the moving statistics, like tf-keras' own layer with the same weights.
    plain = keras.layers.BatchNormalization()
    plain.build(x.shape)
    plain.set_weights(sync_bn.get_weights())
    np.testing.assert_allclose(sync_bn(x, training=False).numpy(),
                               plain(x, training=False).numpy(), rtol=1e-6, atol=1e-6)


def test_sync_batch_norm_keras2_trains_a_model_to_identical_weights():
    tf.keras.utils.set_random_seed(7)  # the same start everywhere
    model = keras.Sequential([keras.layers.Dense(8, input_shape=(6,)),
                              hvd_tf.SyncBatchNormalization(), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    x = np.random.default_rng(hvd.rank()).normal(size=(8, 6)).astype(np.float32)
    model.fit(x, x.sum(1, keepdims=True), batch_size=4, epochs=2, verbose=0, shuffle=False)
    _same_on_every_rank(model.get_weights())


def test_sync_batch_norm_keras2_refuses_fused_and_synchronized():
    with pytest.raises(ValueError, match="fused=True"):
        hvd_tf.SyncBatchNormalization(fused=True)
    with pytest.raises(ValueError, match="fused=None"):
        hvd_tf.SyncBatchNormalization(fused=None)
    with pytest.raises(ValueError, match="synchronized=True"):
        hvd_tf.SyncBatchNormalization(synchronized=True)
    layer = hvd_tf.SyncBatchNormalization(axis=1)
    assert layer.name.startswith("sync_batch_normalization") and layer.fused is False
    assert type(layer).from_config(layer.get_config()).axis == layer.axis


def test_value_helpers():
    r, n = hvd.rank(), hvd.size()
    np.testing.assert_allclose(hvd.allreduce(np.array([r, 1.0])), [(n - 1) / 2, 1.0])
    np.testing.assert_allclose(hvd.allreduce(np.array([r + 1.0]), op=hvd.Sum),
                               [n * (n + 1) / 2])
    np.testing.assert_array_equal(hvd.allgather(np.array([[r]])), np.arange(n)[:, None])
    np.testing.assert_array_equal(hvd.broadcast(np.array([r, r]), root_rank=n - 1),
                                  [n - 1, n - 1])
    with pytest.raises(RuntimeError, match="eager"):
        hvd.broadcast_global_variables(0)
