"""DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state.

Each rank's data is a deterministic function of its rank, so every rank can compute the
single-process reference (the average of all ranks' gradients) on its own."""

import gc
import warnings

import pytest
import torch

import tutti.torch as hvd


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(rank, step=0):
    g = torch.Generator().manual_seed(1000 + 17 * rank + step)
    return torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)


def loss_of(model, rank, step=0):
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def reference_grads(size, steps=(0,)):
    """Average over ranks of the gradient summed over `steps` local passes."""
    model = make_model()
    grads = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(size):
        model.zero_grad()
        for s in steps:
            loss_of(model, r, s).backward()
        for g, p in zip(grads, model.parameters()):
            g += p.grad / size
    return grads


def reference_params(size, lr=0.1, steps=(0,), scale=1.0):
    model = make_model()
    grads = reference_grads(size, steps)
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= lr * scale * g
    return [p.detach() for p in model.parameters()]


def train_one_step(rank, lr=0.1, steps=(0,), **kwargs):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), **kwargs)
    for s in steps:
        loss_of(model, rank, s).backward()
    opt.step()
    return model, opt


def assert_params(model, expected, atol=1e-6):
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.detach(), e, atol=atol), (p, e)


def assert_same_on_all_ranks(model, name):
    for i, p in enumerate(model.parameters()):
        gathered = hvd.allgather(p.detach().unsqueeze(0), name="%s.%d" % (name, i))
        assert torch.equal(gathered.min(0).values, gathered.max(0).values)


def test_matches_averaged_sgd(rank, size):
    model, _ = train_one_step(rank)
    assert_params(model, reference_params(size))
    assert_same_on_all_ranks(model, "opt.same.plain")


def test_several_steps(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    for step in range(3):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
    assert_same_on_all_ranks(model, "opt.same.steps")


def test_backward_passes_per_step(rank, size):
    model, opt = train_one_step(rank, steps=(0, 1), backward_passes_per_step=2)
    assert_params(model, reference_params(size, steps=(0, 1)))
    # A third pass before step() is more than backward_passes_per_step allows.
    opt.zero_grad()
    loss_of(model, rank, 2).backward()
    loss_of(model, rank, 3).backward()
    with pytest.raises(AssertionError):
        loss_of(model, rank, 4).backward()
    opt.synchronize()


def test_set_backward_passes_per_step(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    for s in (0, 1):
        loss_of(model, rank, s).backward()
    with pytest.raises(AssertionError, match="in flight"):
        opt.set_backward_passes_per_step(1)
    opt.step()
    assert_params(model, reference_params(size, steps=(0, 1)))


@pytest.mark.parametrize("groups", [1, 2, "lists"])
def test_groups(groups, rank, size):
    if groups == "lists":
        model = make_model()
        params = list(model.parameters())
        groups = [[params[0], params[3]], [params[1]]]  # params[2] forms its own group
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       groups=groups)
        loss_of(model, rank).backward()
        opt.step()
    else:
        model, _ = train_one_step(rank, groups=groups)
    assert_params(model, reference_params(size))


@pytest.mark.parametrize("compression,atol", [("fp16", 1e-3), ("bf16", 1e-2)])
def test_16bit_compression(rank, size, compression, atol):
    model, _ = train_one_step(rank, compression=getattr(hvd.Compression, compression))
    assert_params(model, reference_params(size), atol=atol)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_predivide_factor_and_sum(rank, size):
    model, _ = train_one_step(rank, gradient_predivide_factor=2.0)
    assert_params(model, reference_params(size), atol=1e-6)
    model, _ = train_one_step(rank, op=hvd.Sum)
    assert_params(model, reference_params(size, scale=size), atol=1e-5)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1),
                                 op=hvd.Sum, gradient_predivide_factor=2.0)


def test_unused_parameter_gets_zero_gradient(rank, size):
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(2))
    params = [("extra", extra)] + list(model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD([extra] + list(model.parameters()), lr=0.1),
                                   named_parameters=params)
    if rank == 0:
        (loss_of(model, rank) + extra.sum()).backward()
    else:
        loss_of(model, rank).backward()
    opt.step()
    assert torch.allclose(extra.detach(), torch.full((2,), 1.0 - 0.1 / size))


def test_synchronize_then_skip_and_zero_grad_guard(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model, rank).backward()
    with pytest.raises(AssertionError):
        opt.zero_grad()  # gradients are still being reduced
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    with opt.skip_synchronize():
        opt.step()
    assert_params(model, reference_params(size))
    loss_of(model, rank, 1).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()  # synchronizes again (nothing in flight) and warns
    assert any("skip_synchronize" in str(w.message) for w in caught)


def test_named_parameters_checked():
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[named[0], named[0]] + named[1:])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=named[1:])


def test_broadcast_parameters(rank, size):
    model = make_model(seed=rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for p, e in zip(model.parameters(), make_model(seed=0).parameters()):
        assert torch.equal(p.detach(), e.detach())
    params = [torch.full((2,), float(rank)), ("named", torch.full((1,), float(rank)))]
    hvd.broadcast_parameters([params[0], params[1]], root_rank=size - 1)
    assert params[0].tolist() == [size - 1.0] * 2 and params[1][1].item() == size - 1.0


@pytest.mark.parametrize("kind", ["adam", "sgd_momentum"])
def test_broadcast_optimizer_state(kind, rank, size):
    model = make_model()
    if kind == "adam":
        base = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), betas=(0.8, 0.9))
    else:
        base = torch.optim.SGD(model.parameters(), lr=0.01 * (rank + 1), momentum=0.5 + rank)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    # Different local state on every rank: one purely local step of the wrapped optimizer.
    loss_of(model, rank).backward()
    opt.synchronize()
    for p in model.parameters():
        p.grad *= rank + 1
    with opt.skip_synchronize():
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    if kind == "adam":
        assert tuple(opt.param_groups[0]["betas"]) == (0.8, 0.9)
    else:
        assert opt.param_groups[0]["momentum"] == 0.5
    for i, p in enumerate(model.parameters()):
        for key, value in sorted(opt.state[p].items()):
            if torch.is_tensor(value):
                gathered = hvd.allgather(value.reshape(1, -1), name="opt.state.%s.%d.%s"
                                         % (kind, i, key))
                assert torch.equal(gathered.min(0).values, gathered.max(0).values), key


def test_broadcast_fresh_optimizer_state(rank, size):
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (rank + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)
    assert len(opt.state) == len(list(model.parameters()))


def test_broadcast_stateless_optimizer_leaves_synced_parameters(rank, size):
    """Mid-training sync (an elastic reset): gradients left by the last backward pass differ
    between ranks, and SGD without momentum has no state under torch 2. Creating the state
    must not step the broadcast parameters with those gradients (or with weight decay)."""
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    loss_of(model, rank).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p, e, g in zip(model.parameters(), make_model(seed=0).parameters(), grads):
        assert torch.equal(p.detach(), e.detach())
        assert torch.equal(p.grad, g)


def test_without_named_parameters_and_frozen_params(rank, size):
    model = make_model()
    frozen = list(model.parameters())[0]
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss_of(model, rank).backward()
    opt.step()
    assert torch.equal(frozen, before)
    expected = reference_params(size)
    for p, e in list(zip(model.parameters(), expected))[1:]:
        assert torch.allclose(p.detach(), e, atol=1e-6)
    assert_same_on_all_ranks(model, "opt.same.unnamed")


def test_bf16_compression_keeps_float32_range(rank, size):
    """fp16 overflows past 65504; bf16 carries float32's exponent."""
    big = torch.full((5,), 1.0e6 * (rank + 1), dtype=torch.float64)
    out = hvd.allreduce(big, name="opt.bf16.big", op=hvd.Sum, compression=hvd.Compression.bf16)
    assert out.dtype == torch.float64
    expected = 1.0e6 * sum(range(1, size + 1))
    assert torch.allclose(out, torch.full((5,), expected, dtype=torch.float64), rtol=1e-2)
    fp16 = hvd.allreduce(big, name="opt.fp16.big", op=hvd.Sum, compression=hvd.Compression.fp16)
    assert torch.isinf(fp16).all()
    halves = torch.ones(3, dtype=torch.float16)
    out = hvd.allreduce(halves, name="opt.bf16.half", op=hvd.Sum, compression=hvd.Compression.bf16)
    assert out.dtype == torch.float16 and torch.equal(out, halves * size)


def test_allreduce_with_fp16_compression(rank, size):
    tensor = torch.full((9,), 0.25 * (rank + 1), dtype=torch.float32)
    out = hvd.allreduce(tensor, name="opt.fp16", compression=hvd.Compression.fp16,
                        op=hvd.Sum)
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.full((9,), 0.25 * sum(range(1, size + 1))))
    ints = torch.arange(4)
    assert torch.equal(hvd.allreduce(ints, name="opt.fp16.int", op=hvd.Sum,
                                     compression=hvd.Compression.fp16), ints * size)


def test_allreduces_start_during_backward(rank, size):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    last_layer = set(model[2].parameters())
    started_before_first_layer = []

    def record(grad):
        # Runs when the gradient reaches the first layer's output: the last layer's
        # gradients are final by then and their allreduces must already be in flight.
        started_before_first_layer.extend(opt._in_flight())
        return grad

    x, y = batch(rank)
    hidden = model[0](x)
    hidden.register_hook(record)
    loss = torch.nn.functional.mse_loss(model[2](model[1](hidden)), y)
    loss.backward()
    assert set(started_before_first_layer) == last_layer
    assert opt._in_flight() == set(model.parameters())
    opt.step()
    assert_params(model, reference_params(size))


def test_refused_gradient_allreduce_fails_backward(rank, size):
    """A gradient allreduce the runtime refuses in the (C++) gradient hook ends backward()
    with the runtime's error, as a Python hook's exception would."""
    if size == 1:
        pytest.skip("needs a process set other than the global one")
    model = make_model()
    process_set = hvd.add_process_set([0])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   process_set=process_set)
    hvd.remove_process_set(process_set)  # the hooks' set is gone
    if rank == 0:
        with pytest.raises(hvd.TuttiValueError, match="allreduce.2.bias"):
            loss_of(model, rank).backward()
    else:  # not in the set: no hooks
        loss_of(model, rank).backward()
    assert not opt._in_flight()


def test_hooks_of_a_dropped_optimizer_do_nothing(rank, size):
    model = make_model()
    first = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    del first
    gc.collect()
    # Were the first optimizer's hooks still live, they would start the same names as the
    # second's and the runtime would refuse one of each pair.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model, rank).backward()
    opt.step()
    assert_params(model, reference_params(size))


def test_broadcast_fresh_optimizer_state_gradients(rank, size):
    """Creating a fresh optimizer's state leaves a trainable parameter that had no gradient
    with a zero one (as horovod.torch does), a frozen one with none, and an existing
    gradient as it was."""
    model = make_model()
    first, second = list(model.children())[0], list(model.children())[2]
    first.bias.requires_grad_(False)
    second.weight.grad = torch.full_like(second.weight, float(rank + 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                        nesterov=True), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert first.bias.grad is None
    assert torch.equal(first.weight.grad, torch.zeros_like(first.weight))
    assert torch.equal(second.weight.grad, torch.full_like(second.weight, float(rank + 1)))
    assert torch.equal(second.bias.grad, torch.zeros_like(second.bias))
