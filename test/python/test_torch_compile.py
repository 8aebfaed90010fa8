"""torch 2.x features training scripts use with tutti.torch: collectives inside a
torch.compile'd function (PyTorch 2.0+; graph breaks allowed, results exact) and
DistributedOptimizer with a compiled model under torch.autocast (bfloat16 on CPU)."""

import copy

import pytest
import torch

import tutti.torch as hvd
from tutti.torch import compiled

needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"),
                                   reason="torch.compile needs PyTorch 2")


@needs_compile
def test_allreduce_and_broadcast_inside_torch_compile(rank, size):
    # With torch.library custom ops (PyTorch 2.4+) the whole function is one graph.
    @torch.compile(backend="aot_eager", fullgraph=compiled.AVAILABLE)
    def step(x):
        return (hvd.allreduce(x * 2, op=hvd.Sum, name="compile.ar")
                + hvd.broadcast(x, root_rank=0, name="compile.bc"))

    for round_ in range(2):  # the second call runs the cached graph
        x = torch.full((4,), float(rank + 1 + round_), requires_grad=True)
        y = step(x)
        expected = 2.0 * sum(r + 1 + round_ for r in range(size)) + 1.0 + round_
        assert torch.equal(y.detach(), torch.full((4,), expected))
        y.sum().backward()
        # Sum-allreduce backward: 2 * size; broadcast backward: the average of ones on
        # the root, zeros elsewhere (Horovod's convention).
        assert torch.equal(x.grad, torch.full((4,), 2.0 * size + (1.0 if rank == 0 else 0.0)))


@needs_compile
def test_other_collectives_inside_torch_compile_break_the_graph(rank, size):
    @torch.compile(backend="aot_eager")
    def gather(x):
        return hvd.allgather(x + 1, name="compile.ag") * 2

    got = gather(torch.full((rank + 1, 2), float(rank)))
    expected = torch.cat([torch.full((r + 1, 2), 2.0 * (r + 1)) for r in range(size)])
    assert torch.equal(got, expected)


def test_distributed_optimizer_compiled_model_autocast_bf16(rank, size):
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = copy.deepcopy(model)  # local gradients, for the expected average
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    run = torch.compile(model, backend="aot_eager") if hasattr(torch, "compile") else model
    for step in range(3):
        data = torch.full((2, 4), float(rank + 1 + step))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(data).float().sum()
        loss.backward()
        optimizer.synchronize()

        reference.load_state_dict(model.state_dict())
        reference.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            reference(data).float().sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert p.grad.dtype == torch.float32, name
            average = hvd.allreduce(q.grad, name="compile.ref.%d.%s" % (step, name))
            assert torch.allclose(p.grad, average), name
        with optimizer.skip_synchronize():
            optimizer.step()
    for name, p in model.named_parameters():
        everyone = hvd.allgather(p.detach().unsqueeze(0), name="compile.params." + name)
        assert all(torch.equal(everyone[0], other) for other in everyone), name


def _compiled_autograd():
    """A context in which backward runs under compiled autograd, or None (older torch)."""
    try:
        from torch._dynamo import compiled_autograd
    except ImportError:
        return None
    enable = getattr(compiled_autograd, "_enable", None)
    return enable(torch.compile(backend="aot_eager")) if enable is not None else None


def test_distributed_optimizer_under_compiled_autograd(rank, size):
    """Compiled autograd leaves the optimizer's C++ gradient hooks out of its graph:
    step() reduces those gradients after backward, and the average is still exact."""
    context = _compiled_autograd()
    if context is None:
        pytest.skip("compiled autograd needs PyTorch 2.2")
    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = copy.deepcopy(model)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    data = torch.full((3, 4), float(rank + 1))
    with context:
        model(data).sum().backward()
    assert not optimizer._in_flight()  # the compiled graph ran no hook
    optimizer.synchronize()
    reference(data).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        average = hvd.allreduce(q.grad, name="compile.autograd.ref." + name)
        assert torch.allclose(p.grad, average), name
    with optimizer.skip_synchronize():
        optimizer.step()
