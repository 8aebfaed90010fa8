"""Bad input across ranks: a TensorFlow error naming the op, the tensor and the ranks, on
every rank, after which the next op works."""

import numpy as np
import pytest
import tensorflow as tf

import tutti.tensorflow as hvd


def _next_op_works():
    out = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after_error")
    np.testing.assert_allclose(out.numpy(), hvd.size())


@pytest.mark.skipif("hvd.size() < 2")
def test_mismatched_shapes_error_on_every_rank():
    shape = [2, 3] if hvd.rank() == 0 else [3, 2]
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        hvd.allreduce(tf.ones(shape), op=hvd.Sum, name="grad.w1")
    message = str(info.value)
    assert "allreduce" in message and "grad.w1" in message, message
    assert "rank" in message, message
    _next_op_works()


@pytest.mark.skipif("hvd.size() < 2")
def test_mismatched_dtypes_error_on_every_rank():
    dtype = tf.float32 if hvd.rank() == 0 else tf.float64
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        hvd.allreduce(tf.ones([4], dtype=dtype), op=hvd.Sum, name="grad.b1")
    message = str(info.value)
    assert "grad.b1" in message and "float" in message, message
    _next_op_works()


@pytest.mark.skipif("hvd.size() < 2")
def test_mismatch_inside_tf_function():
    @tf.function
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum, name="in_function")

    with pytest.raises(tf.errors.FailedPreconditionError, match="in_function"):
        step(tf.ones([hvd.rank() + 1]))
    _next_op_works()


def test_broadcast_bad_root():
    with pytest.raises(tf.errors.OpError, match="root"):
        hvd.broadcast(tf.ones([2]), root_rank=hvd.size() + 3, name="bad_root")
    _next_op_works()
