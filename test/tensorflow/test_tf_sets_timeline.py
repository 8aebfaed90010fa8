"""Process sets and the timeline: ops on a subset of the ranks, and tensor names of
TensorFlow ops in Tutti's timeline."""

import json
import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import tutti.tensorflow as hvd


def _pair():
    """Ranks 0 and 1 as a process set: the global one at 2 ranks (a second set of every
    rank is refused, as in Horovod), an added one beyond."""
    return hvd.global_process_set if hvd.size() == 2 else hvd.add_process_set([0, 1])


def _done(ps):
    if ps is not hvd.global_process_set:
        hvd.remove_process_set(ps)


@pytest.mark.skipif("hvd.size() < 2")
def test_process_set_ops():
    ranks = [0, 1]
    ps = _pair()
    try:
        assert ps.size() == 2
        if hvd.rank() in ranks:
            assert ps.included() and ps.rank() == hvd.rank()
            out = hvd.allreduce(tf.fill([3], float(hvd.rank() + 1)), op=hvd.Sum,
                                process_set=ps)
            np.testing.assert_allclose(out.numpy(), 3.0)
            gathered = hvd.allgather(tf.fill([hvd.rank() + 1], hvd.rank()), process_set=ps)
            np.testing.assert_array_equal(gathered.numpy(), [0, 1, 1])
            g = tf.fill([2], 1.0)
            with tf.GradientTape() as tape:
                tape.watch(g)
                y = hvd.allreduce(g, op=hvd.Sum, process_set=ps)
            np.testing.assert_allclose(tape.gradient(y, g).numpy(), 2.0)
        else:
            assert not ps.included()
    finally:
        _done(ps)


@pytest.mark.skipif("hvd.size() < 2")
def test_gradient_tape_on_a_process_set():
    # Ranks outside the set keep their own gradients; members get the set's average.
    ps = _pair()
    try:
        x = tf.constant(float(hvd.rank()))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        grad, = hvd.DistributedGradientTape(tape, process_set=ps).gradient(y, [x])
        expected = 2.0 * (0 + 1) / 2 if hvd.rank() in (0, 1) else 2.0 * hvd.rank()
        assert float(grad) == expected
    finally:
        _done(ps)


def test_process_set_ids_ranks_and_names():
    from tutti.tensorflow import basics
    n = hvd.size()
    assert basics._get_process_set_ids_and_ranks() == {0: list(range(n))}
    assert str(hvd.global_process_set) == \
        "ProcessSet(process_set_id=0, ranks=%s, mpi_comm=None)" % list(range(n))
    if n == 1:  # [0] is every rank: a second set of them is refused, as in Horovod
        with pytest.raises(ValueError, match=r"ranks \[0\] are those of the global process set"):
            hvd.add_process_set([0])
        return
    ps = hvd.add_process_set([0])
    try:
        assert basics._get_process_set_ids_and_ranks() == {0: list(range(n)),
                                                           ps.process_set_id: [0]}
        assert str(ps) == "ProcessSet(process_set_id=%d, ranks=[0], mpi_comm=None)" % (
            ps.process_set_id)
    finally:
        assert hvd.remove_process_set(ps)
    assert basics._get_process_set_ids_and_ranks() == {0: list(range(n))}
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_unregistered_process_set_refused():
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(tf.ones([1]), process_set=hvd.ProcessSet([0]))
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10  # an id no rank registered (Horovod's test does this)
    with pytest.raises(ValueError, match="process set id 10 is not registered"):
        hvd.allreduce(tf.ones([1]), process_set=fake)


@pytest.mark.skipif("hvd.size() < 2")
def test_broadcast_in_a_process_set_takes_a_global_root():
    # The set of the odd ranks (or of rank 1 and the last): root_rank is a global rank, as
    # in Horovod and tutti.torch, not a position in the set.
    ranks = [r for r in range(hvd.size()) if r % 2 == 1] or [1]
    if len(ranks) == 1 and hvd.size() > 2:
        ranks.append(hvd.size() - 1)
    ps = hvd.add_process_set(ranks)
    try:
        if hvd.rank() in ranks:
            for root in ranks:
                out = hvd.broadcast(tf.fill([3], float(hvd.rank())), root, process_set=ps,
                                    name="set_broadcast.%d" % root)
                np.testing.assert_array_equal(out.numpy(), float(root))
                obj = hvd.broadcast_object({"from": hvd.rank()}, root_rank=root,
                                           process_set=ps, name="set_object.%d" % root)
                assert obj == {"from": root}
            with pytest.raises(ValueError, match="root_rank 0 is not in the process set"):
                hvd.broadcast(tf.ones([1]), 0, process_set=ps)
    finally:
        hvd.remove_process_set(ps)


def test_timeline_carries_tensor_names():
    path = hvd.broadcast_object(
        os.path.join(tempfile.mkdtemp(prefix="tutti-tf-timeline-"), "timeline.json")
        if hvd.rank() == 0 else None, root_rank=0, name="timeline_path")
    hvd.start_timeline(path)
    try:
        hvd.allreduce(tf.ones([4]), op=hvd.Sum, name="timeline.named_tensor")

        @tf.function
        def traced(x):
            return hvd.allreduce(x, op=hvd.Sum)

        traced(tf.ones([2]))
    finally:
        hvd.stop_timeline()
    hvd.barrier()
    if hvd.rank() == 0:
        with open(path) as f:
            text = f.read()
        assert "timeline.named_tensor" in text, text[:2000]
        assert "allreduce.x_0" in text, text[:2000]  # the graph name of the traced input
        json.loads(text if text.rstrip().endswith("]") else text.rstrip().rstrip(",") + "]")
