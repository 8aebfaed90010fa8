"""tutti.tensorflow.SyncBatchNormalization: on every rank, the output, the moving statistics and
the gradients are those of plain batch normalization over the ranks' batches put together,
with batches of different sizes on different ranks, eagerly and in a tf.function."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tutti.tensorflow as hvd


def _batch(rank, channels_last):
    """Rank r holds r + 2 rows (different sizes), channels on axis 1 or -1."""
    rng = np.random.default_rng(10 + rank)
    x = rng.normal(loc=rank, scale=1.0 + rank, size=(rank + 2, 3, 4)).astype("float32")
    return x if channels_last else np.transpose(x, (0, 2, 1))


def _reference(channels_last, axis):
    """Plain BatchNormalization over every rank's batch concatenated, with the gradient of
    sum(output * w) with respect to the input, gamma and beta."""
    xs = [_batch(r, channels_last) for r in range(hvd.size())]
    full = tf.constant(np.concatenate(xs))
    bn = keras.layers.BatchNormalization(axis=axis, momentum=0.5)
    bn.build(full.shape)
    w = tf.constant(np.linspace(-1, 1, int(np.prod(full.shape[1:]))).reshape(full.shape[1:]),
                    tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(full)
        out = bn(full, training=True)
        loss = tf.reduce_sum(out * w)
    dx, dgamma, dbeta = tape.gradient(loss, [full, bn.gamma, bn.beta])
    start = sum(x.shape[0] for x in xs[:hvd.rank()])
    stop = start + xs[hvd.rank()].shape[0]
    return (out.numpy()[start:stop], dx.numpy()[start:stop], dgamma.numpy(), dbeta.numpy(),
            bn.moving_mean.numpy(), bn.moving_variance.numpy(), w)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("in_function", [False, True])
def test_sync_batch_norm_matches_the_global_batch(channels_last, in_function):
    axis = -1 if channels_last else 1
    out_ref, dx_ref, dgamma_ref, dbeta_ref, mean_ref, var_ref, w = _reference(channels_last, axis)
    x = tf.constant(_batch(hvd.rank(), channels_last))
    sync_bn = hvd.SyncBatchNormalization(axis=axis, momentum=0.5)
    sync_bn.build(x.shape)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = sync_bn(x, training=True)
            loss = tf.reduce_sum(out * w)
        return (out,) + tuple(tape.gradient(loss, [x, sync_bn.gamma, sync_bn.beta]))

    if in_function:
        step = tf.function(step)
    out, dx, dgamma, dbeta = step(x)
    np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx.numpy(), dx_ref, rtol=1e-3, atol=1e-4)
    # gamma and beta: each rank's gradient is its share; their sum is the global gradient.
    np.testing.assert_allclose(hvd.allreduce(dgamma, op=hvd.Sum).numpy(), dgamma_ref,
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(hvd.allreduce(dbeta, op=hvd.Sum).numpy(), dbeta_ref,
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sync_bn.moving_mean.numpy(), mean_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sync_bn.moving_variance.numpy(), var_ref, rtol=1e-4, atol=1e-5)
    # Inference uses the moving statistics: no communication, the local batch only.
    plain = keras.layers.BatchNormalization(axis=axis)
    plain.build(x.shape)
    plain.set_weights(sync_bn.get_weights())
    np.testing.assert_allclose(sync_bn(x, training=False).numpy(),
                               plain(x, training=False).numpy(), rtol=1e-6, atol=1e-6)


def test_sync_batch_norm_trains_a_model_to_identical_weights():
    keras.utils.set_random_seed(7)  # the same start everywhere
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                              hvd.SyncBatchNormalization(), keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(16, 6)).astype("float32")
    model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=2, verbose=0, shuffle=False)
    flat = np.concatenate([np.ravel(v) for v in model.get_weights()])[None, :]
    gathered = hvd.allgather(tf.constant(flat)).numpy()
    np.testing.assert_array_equal(gathered, np.repeat(gathered[:1], hvd.size(), axis=0))


def test_sync_batch_norm_refuses_fused_and_synchronized():
    with pytest.raises(ValueError, match="fused=True"):
        hvd.SyncBatchNormalization(fused=True)
    with pytest.raises(ValueError, match="synchronized=True"):
        hvd.SyncBatchNormalization(synchronized=True)
    assert hvd.SyncBatchNormalization().name.startswith("sync_batch_normalization")


def test_sync_batch_norm_counts_only_unmasked_values():
    # Rank r holds r + 2 rows of 3 steps of 4 channels; a mask (per row and step) drops some.
    def masked(rank):
        x = _batch(rank, channels_last=True)
        mask = (np.arange(x.shape[0] * 3).reshape(x.shape[0], 3) + rank) % 3 != 0
        return x, mask

    parts = [masked(r) for r in range(hvd.size())]
    full = tf.constant(np.concatenate([p[0] for p in parts]))
    full_mask = tf.constant(np.concatenate([p[1] for p in parts]))
    bn = keras.layers.BatchNormalization(momentum=0.0)
    bn(full, training=True, mask=full_mask)
    x, mask = parts[hvd.rank()]
    sync_bn = hvd.SyncBatchNormalization(momentum=0.0)
    sync_bn(tf.constant(x), training=True, mask=tf.constant(mask))
    # momentum 0: the moving statistics are the batch's moments.
    np.testing.assert_allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sync_bn.moving_variance.numpy(), bn.moving_variance.numpy(),
                               rtol=1e-4, atol=1e-5)
