"""SyncBatchNormalization: Keras batch normalization whose batch statistics span the ranks.

One class for both Kerases: its base is Keras 3's keras.layers.BatchNormalization, or tf-keras'
tf.keras.layers.BatchNormalization where tf.keras is legacy Keras 2 (TF_USE_LEGACY_KERAS=1).
Only the hook that computes the batch moments differs between the two (_moments); the moments
themselves, the argument checks and the allreduce are the same code."""

import os

import tensorflow as tf

from tutti.tensorflow.basics import global_process_set
from tutti.tensorflow.mpi_ops import Sum, _allreduce, _normalize_name


def _keras2():
    """Whether tf.keras is legacy Keras 2: TF_USE_LEGACY_KERAS is one of the values TensorFlow
    reads, or `keras` itself is 2.x (TensorFlow 2.15 and older). The same test as
    tutti.keras' _KERAS2, which cannot import it from here: tutti.keras runs without
    TensorFlow on the jax and torch backends."""
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        return True
    import keras
    return keras.__version__.startswith("2.")


_KERAS2 = _keras2()
if _KERAS2:
    _BatchNormalization = tf.keras.layers.BatchNormalization  # tf-keras (or a keras 2.x)
else:
    import keras
    _BatchNormalization = keras.layers.BatchNormalization


class SyncBatchNormalization(_BatchNormalization):
    """Batch normalization (keras.layers.BatchNormalization; on legacy Keras 2,
    tf.keras.layers.BatchNormalization of tf-keras) whose mean and variance, in training, are
    those of the whole batch over the ranks of `process_set`, not of this rank's share
    (horovod.tensorflow.SyncBatchNormalization).

    Each training call sums, per channel, the count of values, their sum and their sum of
    squares over the ranks in one allreduce, so ranks may hold batches of different sizes
    (and masked values do not count). The moving statistics are updated from the global
    moments, so they are the same on every rank. Gradients flow through the allreduce (its
    gradient is the allreduce of the incoming gradients), so the backward pass is that of
    batch normalization over the global batch. Inference uses the moving statistics, with no
    communication. Every rank of the set must call the layer in training together. The
    process set is not part of the layer's config: a saved and reloaded layer synchronizes
    over all ranks.
    """

    def __init__(self, fused=False, process_set=global_process_set, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=%r (it computes "
                             "the moments itself; pass fused=False or leave it out)" % (fused,))
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes through Tutti; "
                             "synchronized=True (tf.distribute's) does not apply")
        if _KERAS2:
            kwargs["fused"] = False  # tf-keras' default (None) would pick the fused kernel
        super().__init__(**kwargs)
        self.process_set = process_set

    if _KERAS2:
        def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
            return self._global_moments(inputs, mask, reduction_axes, keep_dims)
    else:
        def _moments(self, inputs, mask):
            return self._global_moments(inputs, mask, self._reduction_axes, False)

    def _global_moments(self, inputs, mask, axes, keepdims):
        """The mean and variance over `axes` of every rank's `inputs` together (values where
        `mask`, of the inputs' shape without the channel axis, is false left out)."""
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1),
                                              tf.shape(inputs)), inputs.dtype)
        # Per channel: the count, the sum and the sum of squares, over the set in one op.
        count = tf.reduce_sum(weights, axis=axes, keepdims=keepdims)
        total = tf.reduce_sum(inputs * weights, axis=axes, keepdims=keepdims)
        total_sq = tf.reduce_sum(tf.square(inputs) * weights, axis=axes, keepdims=keepdims)
        # The layer's name (Keras numbers unnamed layers in the order they are made) names
        # the allreduce: every rank must make its layers in the same order.
        stats = _allreduce(tf.stack([count, total, total_sq]), op=Sum,
                           name="sync_batch_norm.%s" % _normalize_name(self.name),
                           process_set=self.process_set)
        count, total, total_sq = tf.unstack(stats)
        count = tf.maximum(count, 1.0)  # a channel with no values anywhere: mean 0, var 0
        mean = total / count
        variance = tf.maximum(total_sq / count - tf.square(mean), 0.0)
        return mean, variance
