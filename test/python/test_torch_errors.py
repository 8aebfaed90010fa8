"""Wrong input raises a Python exception carrying the runtime's message on every rank, and
the runtime keeps working afterwards."""

import time

import pytest
import torch

import tutti.torch as hvd


def check_still_works(name, size):
    out = hvd.allreduce(torch.ones(3), name=name, op=hvd.Sum)
    assert torch.equal(out, torch.full((3,), float(size)))


def skip_single(size):
    if size == 1:
        pytest.skip("a mismatch needs at least two ranks")


def test_shape_mismatch(rank, size):
    skip_single(size)
    tensor = torch.ones(4, 8 + (1 if rank == 1 else 0))
    with pytest.raises(hvd.TuttiError) as info:
        hvd.allreduce(tensor, name="err.shape")
    message = str(info.value)
    assert "err.shape" in message and "shape" in message, message
    assert isinstance(info.value, RuntimeError)
    assert info.value.code == 2  # TUTTI_ERR_MISMATCH
    check_still_works("err.shape.after", size)


def test_dtype_mismatch(rank, size):
    skip_single(size)
    tensor = torch.ones(5, dtype=torch.float32 if rank == 0 else torch.int32)
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(tensor, name="err.dtype")
    assert "err.dtype" in str(info.value)
    check_still_works("err.dtype.after", size)


def test_op_mismatch(rank, size):
    skip_single(size)
    with pytest.raises(hvd.TuttiError, match="err.op"):
        hvd.allreduce(torch.ones(2), name="err.op", op=hvd.Sum if rank == 0 else hvd.Max)
    check_still_works("err.op.after", size)


def test_scale_mismatch(rank, size):
    skip_single(size)
    with pytest.raises(hvd.TuttiError, match="err.scale"):
        hvd.allreduce(torch.ones(2), name="err.scale", op=hvd.Sum,
                      prescale_factor=1.0 + rank)
    check_still_works("err.scale.after", size)


def test_broadcast_root_mismatch(rank, size):
    skip_single(size)
    with pytest.raises(hvd.TuttiError, match="err.root"):
        hvd.broadcast(torch.ones(2), root_rank=rank, name="err.root")
    check_still_works("err.root.after", size)


def test_broadcast_shape_mismatch(rank, size):
    skip_single(size)
    with pytest.raises(hvd.TuttiError, match="err.bcast_shape"):
        hvd.broadcast(torch.ones(2 + rank), root_rank=0, name="err.bcast_shape")
    check_still_works("err.bcast_shape.after", size)


def test_allgather_trailing_dims_mismatch(rank, size):
    skip_single(size)
    with pytest.raises(hvd.TuttiError, match="err.allgather"):
        hvd.allgather(torch.ones(2, 3 + rank), name="err.allgather")
    check_still_works("err.allgather.after", size)


def test_alltoall_bad_splits(rank, size):
    with pytest.raises(hvd.TuttiError):
        # The splits add up to more rows than the tensor has.
        hvd.alltoall(torch.ones(size, 2), splits=[2] * size, name="err.splits")
    check_still_works("err.splits.after", size)


def test_duplicate_name(rank, size):
    tensor = torch.ones(10)
    # Rank 0 submits first; the others submit only after the barrier, which rank 0 enters
    # after its duplicate attempt, so the first op is still in flight then.
    if rank == 0:
        first = hvd.allreduce_async(tensor, name="err.duplicate", op=hvd.Sum)
        with pytest.raises(ValueError) as info:
            hvd.allreduce_async(tensor, name="err.duplicate", op=hvd.Sum)
        assert isinstance(info.value, hvd.DuplicateNameError)
        assert info.value.code == 10  # TUTTI_ERR_DUPLICATE_NAME
        assert "err.duplicate" in str(info.value)
        hvd.barrier()
    else:
        hvd.barrier()
        first = hvd.allreduce_async(tensor, name="err.duplicate", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(first), torch.full((10,), float(size)))
    # Reusing the name after synchronize is fine.
    second = hvd.allreduce_async(tensor, name="err.duplicate", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(second), torch.full((10,), float(size)))


def test_a_name_stays_taken_until_synchronized(rank, size):
    # On every rank, for every kind of op, also once the first op has finished: the refusal
    # does not depend on how fast the op ran, and the refused call starts nothing.
    starts = {
        "allreduce": lambda: hvd.allreduce_async(torch.ones(4), name="taken", op=hvd.Sum),
        "allgather": lambda: hvd.allgather_async(torch.ones(2, 3), name="taken"),
        "broadcast": lambda: hvd.broadcast_async(torch.ones(3), 0, name="taken"),
        "alltoall": lambda: hvd.alltoall_async(torch.ones(size, 2), name="taken"),
        "reducescatter": lambda: hvd.reducescatter_async(torch.ones(size, 2), name="taken",
                                                         op=hvd.Sum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce_async([torch.ones(2)] * 2,
                                                                 name="taken", op=hvd.Sum),
    }
    for op, start in starts.items():
        first = start()
        for _ in range(2000):  # every rank submitted it: it finishes; the name stays taken
            if hvd.poll(first):
                break
            time.sleep(0.005)
        assert hvd.poll(first), op
        with pytest.raises(hvd.DuplicateNameError) as info:
            start()
        assert info.value.code == 10
        assert "not synchronized" in str(info.value) and op in str(info.value), str(info.value)
        hvd.synchronize(first)
        hvd.synchronize(start())  # free again once synchronized
    check_still_works("taken.after", size)


def test_unsupported_dtype(rank, size):
    with pytest.raises(hvd.TuttiError, match="(?i)complex"):
        hvd.allreduce(torch.ones(3, dtype=torch.complex64), name="err.complex")
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(3, dtype=torch.complex64), name="err.complex2")
    check_still_works("err.complex.after", size)


def test_average_on_bool_is_an_error(rank, size):
    with pytest.raises(hvd.TuttiError):
        hvd.synchronize(hvd.allreduce_async(torch.ones(3, dtype=torch.bool), name="err.bool",
                                            op=hvd.Average))
    check_still_works("err.bool.after", size)


def test_adasum_and_unknown_ops(rank, size):
    with pytest.raises(NotImplementedError):  # allreduce's Adasum: test_torch_adasum.py
        hvd.reducescatter(torch.ones(size, 2), name="err.adasum", op=hvd.Adasum)
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), name="err.unknown_op", op=12345)
    check_still_works("err.ops.after", size)


def test_unregistered_process_set():
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), name="err.set", process_set=hvd.ProcessSet([0]))


def test_not_a_tensor():
    with pytest.raises(TypeError):
        hvd.allreduce_async([1.0, 2.0], name="err.list")
