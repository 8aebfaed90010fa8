"""join with uneven amounts of data per rank, and barrier."""

import time

import pytest

import torch

import tutti.torch as hvd


def test_join_uneven_batches(rank, size):
    # Rank r has r + 1 batches; after its last one it joins and contributes zeros.
    batches = rank + 1
    for step in range(batches):
        out = hvd.allreduce(torch.ones(3), name="join.step.%d" % step, op=hvd.Sum)
        # Ranks that still have data at this step: those with rank >= step.
        assert torch.equal(out, torch.full((3,), float(size - step))), (step, out)
        avg = hvd.allreduce(torch.ones(2), name="join.avg.%d" % step, op=hvd.Average)
        # Average divides by the full size even while ranks have joined.
        assert torch.allclose(avg, torch.full((2,), (size - step) / size))
    last = hvd.join()
    assert last == size - 1
    # Everything works normally after a join.
    out = hvd.allreduce(torch.ones(2), name="join.after", op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(size)))


def test_join_all_at_once(rank, size):
    assert 0 <= hvd.join() < size


def test_barrier(rank, size):
    # The last rank arrives late; nobody may leave the barrier before it enters.
    if rank == size - 1:
        time.sleep(0.5)
    stamp = torch.tensor([time.time()], dtype=torch.float64)
    hvd.barrier()
    left = time.time()
    entries = hvd.allgather(stamp, name="barrier.stamps")
    assert left >= entries.max().item() - 1e-3
    hvd.barrier()


def test_allgather_while_a_rank_has_joined(rank, size):
    if size == 1:
        pytest.skip("needs a rank that has joined and one that has not")
    if rank == 0:
        assert hvd.join() != 0
    else:
        try:
            hvd.allgather(torch.ones(1), name="join.allgather")
            raise AssertionError("allgather while rank 0 has joined did not fail")
        except hvd.TuttiError as error:
            assert error.code == 9, error  # TUTTI_ERR_JOINED
        hvd.join()
    out = hvd.allgather(torch.tensor([rank]), name="join.allgather.after")
    assert out.tolist() == list(range(size))
