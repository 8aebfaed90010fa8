"""Before init: every op and topology call says to call init. Runs first (its name sorts
first); the session fixture initializes afterwards... so this module opts out of it by
running its checks at import, before any fixture."""

import tensorflow as tf

import tutti.tensorflow as hvd

_BEFORE = {}
if not hvd.is_initialized():
    try:
        hvd.allreduce(tf.constant([1.0]))
    except tf.errors.FailedPreconditionError as e:
        _BEFORE["allreduce"] = str(e)
    try:
        hvd.rank()
    except ValueError as e:
        _BEFORE["rank"] = str(e)


def test_op_before_init_says_to_call_init():
    assert "call hvd.init() first" in _BEFORE["allreduce"], _BEFORE
    assert "tutti.allreduce" in _BEFORE["allreduce"]
    assert "call hvd.init() first" in _BEFORE["rank"]


def test_topology_after_init():
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert hvd.cross_size() >= 1 and 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.gloo_built() or hvd.mpi_built()
