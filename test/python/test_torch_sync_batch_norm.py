"""hvd.SyncBatchNorm against torch's BatchNorm over every rank's batch together, computed in
float64 on each rank from the same deterministic data (ranks have different batch sizes).

Tolerances: float64 layers match the float64 reference to 1e-10; float32 layers to 1e-5
(relative and absolute: float32 rounding of values of order 1 over a few dozen elements).
"""

import pytest
import torch

import tutti.torch as hvd

CHANNELS = 3


def rank_batch(r, rows, dtype):
    g = torch.Generator().manual_seed(500 + r)
    x = torch.randn(rows, CHANNELS, 4, generator=g, dtype=torch.float64) * (r + 1) + r
    dy = torch.randn(rows, CHANNELS, 4, generator=g, dtype=torch.float64)
    return x.to(dtype), dy.to(dtype)


def reference(size, rows_of, momentum):
    """Output, input gradient (per rank), weight/bias gradients and running statistics of
    torch.nn.BatchNorm1d on the concatenation of every rank's batch, in float64."""
    batches = [rank_batch(r, rows_of(r), torch.float64) for r in range(size)]
    x = torch.cat([b[0] for b in batches]).requires_grad_()
    dy = torch.cat([b[1] for b in batches])
    bn = torch.nn.BatchNorm1d(CHANNELS, momentum=momentum).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
        bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    out = bn(x)
    out.backward(dy)
    bounds = [0]
    for r in range(size):
        bounds.append(bounds[-1] + rows_of(r))
    pieces = [(out[bounds[r]:bounds[r + 1]].detach(), x.grad[bounds[r]:bounds[r + 1]])
              for r in range(size)]
    return pieces, bn


def run_layer(rank, rows, dtype, momentum, device="cpu"):
    layer = hvd.SyncBatchNorm(CHANNELS, momentum=momentum).to(device, dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
        layer.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    x, dy = rank_batch(rank, rows, dtype)
    x = x.to(device).requires_grad_()
    out = layer(x)
    out.backward(dy.to(device))
    return layer, out, x.grad


def check(rank, size, rows_of, dtype, tol, momentum=0.1, device="cpu"):
    pieces, bn = reference(size, rows_of, momentum)
    layer, out, grad = run_layer(rank, rows_of(rank), dtype, momentum, device)
    close = dict(rtol=tol, atol=tol)
    expected_out, expected_grad = pieces[rank]
    assert out.dtype == dtype and out.shape == expected_out.shape
    assert torch.allclose(out.cpu().double(), expected_out, **close)
    assert torch.allclose(grad.cpu().double(), expected_grad, **close)
    assert torch.allclose(layer.running_mean.cpu().double(), bn.running_mean, **close)
    assert torch.allclose(layer.running_var.cpu().double(), bn.running_var, **close)
    # Weight and bias gradients stay local (DistributedOptimizer reduces them): their sum
    # over the ranks is the whole batch's.
    for mine, full, what in ((layer.weight.grad, bn.weight.grad, "weight"),
                             (layer.bias.grad, bn.bias.grad, "bias")):
        total = hvd.allreduce(mine.cpu().double(), op=hvd.Sum, name="sbn.check." + what)
        assert torch.allclose(total, full, **close), what
    # Every rank holds the same running statistics, bit for bit.
    stats = torch.cat([layer.running_mean, layer.running_var]).cpu().reshape(1, -1)
    gathered = hvd.allgather(stats, name="sbn.check.same")
    assert torch.equal(gathered.min(0).values, gathered.max(0).values)
    return layer


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_sync_batch_norm_matches_whole_batch(rank, size, dtype, tol):
    layer = check(rank, size, lambda r: r + 1, dtype, tol)
    assert int(layer.num_batches_tracked) == 1
    # Eval mode: a plain BatchNorm with the (synchronized) running statistics.
    layer.eval()
    x, _ = rank_batch(rank, 2, dtype)
    expected = torch.nn.functional.batch_norm(x, layer.running_mean, layer.running_var,
                                              layer.weight, layer.bias, False, 0.0, layer.eps)
    assert torch.equal(layer(x), expected)


def test_sync_batch_norm_cumulative_average_and_empty_batch(rank, size):
    # momentum=None: the cumulative average (one batch: the batch's statistics). The last
    # rank's batch is empty where there are several ranks.
    check(rank, size, lambda r: 0 if size > 1 and r == size - 1 else 2, torch.float64, 1e-10,
          momentum=None)


def test_sync_batch_norm_errors(rank, size):
    layer = hvd.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        layer(torch.ones(CHANNELS))
    with pytest.raises(ValueError, match="num_features=3"):
        layer(torch.ones(2, CHANNELS + 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_sync_batch_norm_cuda(rank, size):
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    check(rank, size, lambda r: r + 1, torch.float32, 1e-5, device="cuda")
