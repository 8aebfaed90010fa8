"""Before init: an op and a topology call say to call init. The checks run while this module
is imported, before conftest.py initializes Tutti (once collection is done)."""

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
