"""join with uneven amounts of data per rank, and barrier."""

import time

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
