"""Small helpers horovod.tensorflow.util has, which scripts and tests import."""

import tensorflow as tf


def _executing_eagerly():
    """True when TensorFlow runs ops eagerly (not while tracing a tf.function or graph)."""
    return tf.executing_eagerly()


def vars_to_refs(vars):  # noqa: A002
    """Hashable keys of tf.Variables (Keras 3 variables have no ref(): their id)."""
    return [v.ref() if hasattr(v, "ref") else id(v) for v in vars]
