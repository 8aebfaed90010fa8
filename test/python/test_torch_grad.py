"""Gradients of the differentiable collectives, with horovod.torch's conventions (a script
moved from Horovod must train the same): allreduce's gradient is the derivative of the
sum over ranks of each rank's loss; allgather and broadcast reduce the incoming gradient
with an AVERAGE allreduce; reducescatter allgathers it, times the set size for Sum."""

import pytest
import torch

import tutti.torch as hvd


def weights(rank, shape):
    """d(loss of `rank`)/d(output): a different weight per rank."""
    return torch.full(shape, float(rank + 1), dtype=torch.float64)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_allreduce_grad(op, rank, size):
    x = torch.arange(6, dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, name="grad.ar.%d" % op, op=op, prescale_factor=2.0)
    y.backward(weights(rank, (6,)))
    # d(sum_r w_r * y)/dx = 2 * sum_r w_r (Sum) or that over size (Average).
    expected = 2.0 * sum(range(1, size + 1)) / (size if op == hvd.Average else 1)
    assert torch.allclose(x.grad, torch.full((6,), expected, dtype=torch.float64))


def test_allreduce_grad_unnamed(rank, size):
    x = torch.ones(3, dtype=torch.float32, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * 3).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 3.0 * size))


def test_grouped_allreduce_grad(rank, size):
    xs = [torch.ones(i + 1, dtype=torch.float64, requires_grad=True) for i in range(3)]
    ys = hvd.grouped_allreduce(xs, name="grad.gar", op=hvd.Average)
    sum(((i + 1) * y).sum() for i, y in enumerate(ys)).backward()
    for i, x in enumerate(xs):
        assert torch.allclose(x.grad, torch.full((i + 1,), float(i + 1), dtype=torch.float64))


def test_allgather_grad(rank, size):
    rows = [r + 1 for r in range(size)]
    x = torch.ones(rows[rank], 2, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x, name="grad.ag")
    y.backward(weights(rank, (sum(rows), 2)) * torch.arange(sum(rows)).reshape(-1, 1))
    start = sum(rows[:rank])
    # The average over ranks of the weights 1..size, times the row index.
    expected = (sum(range(1, size + 1)) / size
                * torch.arange(start, start + rows[rank], dtype=torch.float64)
                .reshape(-1, 1).expand(-1, 2))
    assert torch.allclose(x.grad, expected)


def test_broadcast_grad(rank, size):
    root = size - 1
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    y = hvd.broadcast(x, root_rank=root, name="grad.bc")
    y.backward(weights(rank, (4,)))
    expected = sum(range(1, size + 1)) / size if rank == root else 0.0
    assert torch.allclose(x.grad, torch.full((4,), expected, dtype=torch.float64))


def test_alltoall_grad(rank, size):
    splits = [1 + (rank + d) % 2 for d in range(size)]
    x = torch.ones(sum(splits), 3, dtype=torch.float64, requires_grad=True)
    y, received = hvd.alltoall(x, splits=splits, name="grad.a2a")
    # Weight each received row by the rank it came from.
    w = torch.cat([torch.full((int(n), 3), float(src + 1), dtype=torch.float64)
                   for src, n in enumerate(received.tolist())])
    y.backward(w)
    # The rows this rank sent to rank d come back weighted by this rank's id + 1.
    assert torch.allclose(x.grad, torch.full_like(x, float(rank + 1)))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_grad(op, rank, size):
    rows = size * 2 + 1
    x = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
    y = hvd.reducescatter(x, name="grad.rs.%d" % op, op=op)
    y.backward(weights(rank, tuple(y.shape)))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    owner = torch.cat([torch.full((c, 2), float(r + 1), dtype=torch.float64)
                       for r, c in enumerate(counts)])
    expected = owner * (size if op == hvd.Sum else 1)
    assert torch.allclose(x.grad, expected)


def test_horovod_gradient_values(rank, size):
    """The exact numbers horovod.torch 0.28.1 gives for a gradient of ones (regression
    test: Tutti once differed by a factor of the world size, silently)."""
    ones = torch.ones(2 * size, 2, dtype=torch.float64)
    x = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    hvd.allgather(x, name="grad.hvd.ag").backward(ones)
    assert torch.equal(x.grad, torch.ones(2, 2, dtype=torch.float64))
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    hvd.broadcast(x, root_rank=0, name="grad.hvd.bc").backward(torch.ones(3, dtype=torch.float64))
    assert torch.equal(x.grad, torch.full((3,), 1.0 if rank == 0 else 0.0, dtype=torch.float64))
    for op, value in ((hvd.Sum, float(size)), (hvd.Average, 1.0)):
        x = torch.ones(size * 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, name="grad.hvd.rs.%d" % op, op=op)
        y.backward(torch.ones_like(y))
        assert torch.equal(x.grad, torch.full((size * 2,), value, dtype=torch.float64)), op


def test_grouped_allgather_reducescatter_grad(rank, size):
    xs = [torch.ones(i + 1, 2, dtype=torch.float64, requires_grad=True) for i in range(2)]
    ys = hvd.grouped_allgather(xs, name="grad.gag")
    assert [tuple(y.shape) for y in ys] == [(size * (i + 1), 2) for i in range(2)]
    sum(y.sum() for y in ys).backward()
    for x in xs:
        assert torch.equal(x.grad, torch.ones_like(x))
    xs = [torch.ones(size * (i + 1), dtype=torch.float64, requires_grad=True)
          for i in range(2)]
    ys = hvd.grouped_reducescatter(xs, name="grad.grs", op=hvd.Sum)
    sum(y.sum() for y in ys).backward()
    for x in xs:
        assert torch.equal(x.grad, torch.full_like(x, float(size)))
