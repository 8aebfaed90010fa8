"""op=hvd.Adasum: allreduce, grouped_allreduce and DistributedOptimizer against a float64
reference that every rank computes from all ranks' deterministic data: Horovod's binary tree
over the ranks in order, combining a and b into
(1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b. Other world sizes than powers of two are
refused as Horovod refuses them.

Tolerances: float64 results match to 1e-12 (relative), float32 to 1e-6, float16 to 1e-3.
"""

import pytest
import torch

import tutti.torch as hvd


def power_of_two(size):
    return size & (size - 1) == 0


def pair(a, b):
    dot = float(a @ b)
    ca = 1 - dot / (2 * float(a @ a)) if float(a @ a) > 0 else 1.0
    cb = 1 - dot / (2 * float(b @ b)) if float(b @ b) > 0 else 1.0
    return ca * a + cb * b


def tree(vectors):
    while len(vectors) > 1:
        vectors = [pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def rank_tensor(r, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(100 * seed + r)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# conftest.py has initialized Tutti.
needs_power_of_two = pytest.mark.skipif(not power_of_two(hvd.size()),
                                        reason="Adasum needs a power-of-two world size")


@needs_power_of_two
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6),
                                       (torch.float16, 1e-3)])
def test_adasum_allreduce_matches_reference(rank, size, dtype, tol):
    expected = tree([rank_tensor(r).reshape(-1) for r in range(size)]).reshape(3, 5)
    got = hvd.allreduce(rank_tensor(rank).to(dtype), op=hvd.Adasum, name="adasum.%s" % dtype)
    assert got.dtype == dtype
    assert torch.allclose(got.double(), expected, rtol=tol, atol=tol)
    gathered = hvd.allgather(got.reshape(1, -1), name="adasum.same.%s" % dtype)
    assert torch.equal(gathered.min(0).values, gathered.max(0).values)
    # In place, with the scale factors: postscale * Adasum(prescale * x).
    tensor = rank_tensor(rank).to(dtype)
    hvd.allreduce_(tensor, op=hvd.Adasum, name="adasum.scaled.%s" % dtype,
                   prescale_factor=0.5, postscale_factor=3.0)
    assert torch.allclose(tensor.double(), 1.5 * expected, rtol=tol, atol=tol)


@needs_power_of_two
def test_adasum_is_not_sum_or_average(rank, size):
    # Identical gradients combine to themselves; orthogonal ones (one basis vector per
    # rank) add up.
    same = hvd.allreduce(torch.tensor([1.0, -2.0, 3.0]), op=hvd.Adasum, name="adasum.same")
    assert torch.allclose(same, torch.tensor([1.0, -2.0, 3.0]))
    basis = torch.zeros(size)
    basis[rank] = rank + 1.0
    got = hvd.allreduce(basis, op=hvd.Adasum, name="adasum.orthogonal")
    assert torch.allclose(got, torch.arange(1.0, size + 1.0))
    zeros = hvd.allreduce(torch.zeros(4), op=hvd.Adasum, name="adasum.zeros")
    assert torch.equal(zeros, torch.zeros(4))


@needs_power_of_two
def test_grouped_adasum_is_per_tensor(rank, size):
    shapes = [(4,), (2, 3)]
    expected = [tree([rank_tensor(r, s, seed=i).reshape(-1) for r in range(size)]).reshape(s)
                for i, s in enumerate(shapes)]
    got = hvd.grouped_allreduce([rank_tensor(rank, s, seed=i) for i, s in enumerate(shapes)],
                                op=hvd.Adasum, name="adasum.group")
    for g, e in zip(got, expected):
        assert torch.allclose(g, e, rtol=1e-12, atol=1e-12)


@needs_power_of_two
def test_adasum_distributed_optimizer(rank, size):
    """Each rank steps SGD on its own gradient; the deltas (-lr * gradient) are combined by
    Adasum and applied from the common starting point."""
    def model_and_grads(r):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).double()
        g = torch.Generator().manual_seed(40 + r)
        x, y = torch.randn(6, 4, generator=g).double(), torch.randn(6, 2, generator=g).double()
        torch.nn.functional.mse_loss(model(x), y).backward()
        return model

    models = [model_and_grads(r) for r in range(size)]
    lr = 0.1
    expected = {name: p.detach() + tree([-lr * dict(m.named_parameters())[name].grad.reshape(-1)
                                         for m in models]).reshape(p.shape)
                for name, p in models[0].named_parameters()}
    model = model_and_grads(rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    opt.step()
    for name, p in model.named_parameters():
        assert torch.allclose(p.detach(), expected[name], rtol=1e-12, atol=1e-12), name
    if size > 1:
        with pytest.raises(AssertionError, match="Adasum"):
            with opt.skip_synchronize():
                pass


def test_adasum_refusals(rank, size):
    if not power_of_two(size):
        with pytest.raises(NotImplementedError, match="power-of-two number of ranks"):
            hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="adasum.np2")
    with pytest.raises(ValueError, match="float16, bfloat16, float32 and float64"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum, name="adasum.int")
    with pytest.raises(NotImplementedError, match="allreduce and grouped_allreduce only"):
        hvd.reducescatter(torch.ones(size, 2), op=hvd.Adasum, name="adasum.rs")
    check = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="adasum.after")
    assert torch.equal(check, torch.full((2,), float(size)))
