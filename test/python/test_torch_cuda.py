"""tutti.torch on CUDA tensors: every collective through the NCCL backend, checked against
the host reference. Skipped where torch sees no CUDA device or Tutti was built without NCCL
(CI has no GPU; docs/nccl.md says how this was run on one).

Each rank uses device local_rank % device_count; with one GPU per rank it runs at any size.
"""

import pytest
import torch

import tutti.torch as hvd
from conftest import all_rank_values, rank_values

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not hvd.nccl_built(),
    reason="no CUDA device, or Tutti built without NCCL")

REDUCIBLE = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
             torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def device():
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def reference(values, op):
    stacked = torch.stack([v.to(torch.float64) for v in values])
    if op == hvd.Sum:
        return stacked.sum(0)
    if op == hvd.Average:
        return stacked.mean(0)
    if op == hvd.Min:
        return stacked.min(0).values
    if op == hvd.Max:
        return stacked.max(0).values
    return stacked.prod(0)


@pytest.mark.parametrize("dtype", REDUCIBLE)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product])
@pytest.mark.parametrize("count", [0, 1, 1023, 1 << 20])
def test_allreduce(rank, size, device, dtype, op, count):
    x = rank_values(rank, (count,), dtype).to(device)
    out = hvd.allreduce(x, op=op, name="cuda.ar.%s.%d.%d" % (dtype, op, count))
    assert out.is_cuda and out.dtype == dtype and out.shape == x.shape
    expected = reference(all_rank_values((count,), dtype), op)
    assert torch.equal(out.cpu().to(torch.float64), expected.to(dtype).to(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_allreduce_average_and_scaling(rank, size, device, dtype):
    x = rank_values(rank, (257,), dtype).to(device)
    out = hvd.allreduce(x, name="cuda.avg.%s" % dtype)  # Horovod's default op: Average
    expected = reference(all_rank_values((257,), dtype), hvd.Average)
    torch.testing.assert_close(out.cpu().to(torch.float64), expected, rtol=1e-2, atol=1e-2)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0,
                        name="cuda.scaled.%s" % dtype)
    expected = reference(all_rank_values((257,), dtype), hvd.Sum) * 2.0
    torch.testing.assert_close(out.cpu().to(torch.float64), expected, rtol=1e-2, atol=1e-2)


def test_allreduce_in_place_and_grouped(rank, size, device):
    xs = [rank_values(rank, (n,), torch.float32).to(device) for n in (1, 5, 4096)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="cuda.grouped")
    for n, out in zip((1, 5, 4096), outs):
        assert torch.equal(out.cpu(), reference(all_rank_values((n,), torch.float32),
                                                hvd.Sum).to(torch.float32))
    y = rank_values(rank, (33,), torch.float32).to(device)
    hvd.allreduce_(y, op=hvd.Sum, name="cuda.inplace")
    assert torch.equal(y.cpu(), reference(all_rank_values((33,), torch.float32),
                                          hvd.Sum).to(torch.float32))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.float16,
                                   torch.bfloat16, torch.float64, torch.bool])
def test_allgather_uneven(rank, size, device, dtype):
    x = rank_values(rank, (rank + 1, 3), dtype).to(device)
    out = hvd.allgather(x, name="cuda.ag.%s" % dtype)
    assert out.is_cuda
    expected = torch.cat([rank_values(r, (r + 1, 3), dtype) for r in range(size)])
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast(rank, size, device, root):
    root = size - 1 if root < 0 else root
    x = rank_values(rank, (1000,), torch.float32).to(device)
    out = hvd.broadcast(x, root_rank=root, name="cuda.bc.%d" % root)
    assert torch.equal(out.cpu(), rank_values(root, (1000,), torch.float32))


def test_alltoall_with_splits(rank, size, device):
    splits = torch.tensor([r + 1 for r in range(size)], dtype=torch.int32)
    x = torch.cat([torch.full((r + 1, 2), float(rank * 100 + r)) for r in range(size)]).to(device)
    out, received = hvd.alltoall(x, splits=splits, name="cuda.a2a")
    assert out.is_cuda
    expected = torch.cat([torch.full((rank + 1, 2), float(src * 100 + rank))
                          for src in range(size)])
    assert torch.equal(out.cpu(), expected)
    assert received.tolist() == [rank + 1] * size


def test_reducescatter(rank, size, device):
    n = 4 * size + 1
    x = rank_values(rank, (n, 2), torch.float32).to(device)
    out = hvd.reducescatter(x, op=hvd.Sum, name="cuda.rs")
    full = reference(all_rank_values((n, 2), torch.float32), hvd.Sum).to(torch.float32)
    rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
    start = sum(rows[:rank])
    assert torch.equal(out.cpu(), full[start:start + rows[rank]])


def test_input_from_another_stream_is_ordered(rank, size, device):
    """A tensor written on a side stream and handed over without a sync: the adapter must
    order the collective after the producing stream (the current stream at submission)."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(1 << 24, device=device)
        for value in range(8):
            x.fill_(float(value))
        out = hvd.allreduce(x, op=hvd.Sum, name="cuda.stream")
    torch.cuda.synchronize()
    assert torch.all(out == 7.0 * size).item()


def test_mixed_cpu_and_cuda_in_one_step(rank, size, device):
    a = torch.ones(10, device=device) * (rank + 1)
    b = torch.ones(10) * (rank + 1)
    ha = hvd.allreduce_async(a, op=hvd.Sum, name="mix.cuda")
    hb = hvd.allreduce_async(b, op=hvd.Sum, name="mix.cpu")
    total = float(sum(range(1, size + 1)))
    assert torch.all(hvd.synchronize(ha).cpu() == total)
    assert torch.all(hvd.synchronize(hb) == total)


def test_scaling_the_device_cannot_do_fails_the_op_not_the_job(rank, size, device):
    x = torch.ones(4, device=device)
    with pytest.raises(hvd.TuttiValueError, match="only sum and average can be scaled"):
        hvd.allreduce(x, op=hvd.Min, prescale_factor=2.0, name="cuda.refused.min")
    with pytest.raises(hvd.TuttiValueError, match="must multiply to an integer"):
        hvd.allreduce(torch.ones(4, dtype=torch.int32, device=device), op=hvd.Sum,
                      prescale_factor=0.5, name="cuda.refused.int")
    assert torch.all(hvd.allreduce(x, op=hvd.Sum, name="cuda.after.refusal").cpu() == size)


def test_reducescatter_average_and_scaling(rank, size, device):
    n = 2 * size + 1
    x = rank_values(rank, (n, 3), torch.float32).to(device)
    out = hvd.reducescatter(x, name="cuda.rs.avg")  # Horovod's default op: Average
    full = reference(all_rank_values((n, 3), torch.float32), hvd.Average).to(torch.float32)
    rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
    start = sum(rows[:rank])
    torch.testing.assert_close(out.cpu(), full[start:start + rows[rank]])
    out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                            name="cuda.rs.scaled")
    full = reference(all_rank_values((n, 3), torch.float32), hvd.Sum).to(torch.float32) * 0.5
    torch.testing.assert_close(out.cpu(), full[start:start + rows[rank]])
