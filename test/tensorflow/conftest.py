"""Shared setup of the tutti.tensorflow and tutti.keras tests: every rank runs the same tests
in the same order, in one process (TensorFlow's import takes seconds: one per rank).

Tutti is initialized once per process (from the launcher's environment; a plain `pytest` is
a world of one) once every test module is collected, and shut down when the session ends.
test_tf_00_init.py checks the errors before init while it is imported.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

# Up to 3 ranks share 2 cores: one thread per pool each avoids oversubscription.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import tutti.tensorflow as hvd  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    if hvd.is_initialized():
        hvd.shutdown()


def pytest_collection_finish(session):
    # After every test module was imported (test_tf_00_init.py checks the errors before init
    # at import), before the first test and its skipif conditions.
    if not hvd.is_initialized():
        hvd.init()


def rank_values(rank, shape, dtype):
    """A deterministic tensor that differs per rank, with small values exact in every dtype."""
    n = 1
    for d in shape:
        n *= d
    base = (tf.range(n, dtype=tf.int64) * 5 + 3 * rank + 1) % 7
    if dtype == tf.bool:
        return tf.reshape(base % 2 == 1, shape)
    if dtype not in (tf.uint8, tf.uint16):
        base = base - 3
    return tf.cast(tf.reshape(base, shape), dtype)
