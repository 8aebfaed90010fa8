"""SyncBatchNormalization: Keras batch normalization whose batch statistics span the ranks."""

import keras
import tensorflow as tf

from tutti.tensorflow.basics import global_process_set
from tutti.tensorflow.mpi_ops import Sum, _allreduce, _normalize_name


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization (keras.layers.BatchNormalization) whose mean and variance, in
    training, are those of the whole batch over the ranks of `process_set`, not of this
    rank's share (horovod.tensorflow.SyncBatchNormalization).

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
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs, mask):
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1),
                                              tf.shape(inputs)), inputs.dtype)
        # Per channel: the count, the sum and the sum of squares, over the set in one op.
        count = tf.reduce_sum(weights, axis=axes)
        total = tf.reduce_sum(inputs * weights, axis=axes)
        total_sq = tf.reduce_sum(tf.square(inputs) * weights, axis=axes)
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
