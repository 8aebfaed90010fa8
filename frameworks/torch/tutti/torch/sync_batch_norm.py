"""SyncBatchNorm: batch normalization whose training statistics cover the whole job's batch.

In training mode each rank computes its batch's per-channel count, mean and sum of squared
deviations; one allgather gives every rank all of them, and every rank combines them in
rank order in float64 (the pairwise variance formula, exact for ranks with unequal or empty
batches), so every rank normalizes with the same global mean and (biased) variance and
updates its running statistics with the same values (running_var: the unbiased variance).
Backward allreduces the two per-channel sums the input gradient needs (sum of dy and of
dy * (x - mean)); the weight and bias gradients stay local, as horovod.torch leaves them,
for DistributedOptimizer to reduce. Works on CPU and CUDA tensors (plain torch ops; the
few statistics travel through host memory).
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from tutti.torch import mpi_ops
from tutti.torch.basics import size


class SyncBatchNorm(_BatchNorm):
    """horovod.torch.SyncBatchNorm: BatchNorm over inputs (N, C, ...) of any rank >= 2 whose
    batch statistics, in training mode, are those of every rank's batch together.

    num_features: C. eps, momentum (None: cumulative average), affine and
    track_running_stats as in torch.nn.BatchNorm1d. Every rank must call forward (and
    backward) for the same layers in the same order. In eval mode with running statistics
    it is a plain local BatchNorm.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm: expected an input of at least 2 dimensions "
                             "(N, C, ...), got %d" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        if input.size(1) != self.num_features:
            raise ValueError("SyncBatchNorm: input has %d channels (dimension 1) but the "
                             "layer has num_features=%d" % (input.size(1), self.num_features))
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
            else:
                factor = self.momentum
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        if size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, True, factor, self.eps)
        running = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if running else None,
            self.running_var if running else None, self.eps, factor)


def _stat_dtype(input):
    return torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype


def _channel_view(tensor, channels):
    """(N, C, ...) -> (C, N * ...)."""
    return tensor.transpose(0, 1).reshape(channels, -1)


def _global_stats(x, channels):
    """Every rank's (count, mean, M2) per channel, combined: (count, mean, biased var)."""
    count = x.size(1)
    if count > 0:
        mean = x.mean(1)
        m2 = ((x - mean.unsqueeze(1)) ** 2).sum(1)
    else:  # an empty local batch counts for nothing
        mean = x.new_zeros(channels)
        m2 = x.new_zeros(channels)
    # 1 + 2C numbers per rank travel through host memory, whatever the input's device.
    local = torch.cat([torch.tensor([float(count)], dtype=torch.float64),
                       mean.to("cpu", torch.float64), m2.to("cpu", torch.float64)])
    gathered = mpi_ops.synchronize(mpi_ops.allgather_async(
        local.unsqueeze(0), name="sync_batch_norm.stats")).to(x.device)
    counts = gathered[:, 0]
    if gathered.size(1) != 1 + 2 * channels or bool((counts < 0).any()):
        raise ValueError("SyncBatchNorm: ranks disagree on the layer (gathered statistics "
                         "of shape %s, expected [size, %d])"
                         % (list(gathered.shape), 1 + 2 * channels))
    total = counts.sum()
    if float(total) <= 1:
        raise ValueError("SyncBatchNorm: expected more than 1 value per channel over all "
                         "ranks in training, got %d" % int(total))
    means, m2s = gathered[:, 1:1 + channels], gathered[:, 1 + channels:]
    mean = (counts.unsqueeze(1) * means).sum(0) / total
    m2 = (m2s + counts.unsqueeze(1) * (means - mean) ** 2).sum(0)
    return total, mean, m2


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor):
        channels = input.size(1)
        dtype = _stat_dtype(input)
        x = _channel_view(input.detach(), channels).to(dtype)
        total, mean64, m2 = _global_stats(x, channels)
        var64 = m2 / total
        if running_mean is not None:
            unbiased = m2 / (total - 1)
            running_mean.mul_(1 - factor).add_(factor * mean64.to(running_mean.dtype))
            running_var.mul_(1 - factor).add_(factor * unbiased.to(running_var.dtype))
        mean = mean64.to(dtype)
        invstd = torch.rsqrt(var64 + eps).to(dtype)
        xhat = (x - mean.unsqueeze(1)) * invstd.unsqueeze(1)
        out = xhat
        if weight is not None:
            out = out * weight.detach().to(dtype).unsqueeze(1)
        if bias is not None:
            out = out + bias.detach().to(dtype).unsqueeze(1)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = float(total)
        ctx.has_bias = bias is not None
        ctx.shape = input.shape
        ctx.input_dtype = input.dtype
        return _unview(out, input.shape).to(input.dtype).contiguous()

    @staticmethod
    def backward(ctx, grad_output):
        xhat, invstd, weight = ctx.saved_tensors
        channels = xhat.size(0)
        dy = _channel_view(grad_output, channels).to(xhat.dtype)
        local_dy = dy.sum(1)
        local_dy_xhat = (dy * xhat).sum(1)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            sums = torch.cat([local_dy, local_dy_xhat]).to("cpu", torch.float64)
            sums = mpi_ops.synchronize(mpi_ops.allreduce_async(
                sums, name="sync_batch_norm.grad_sums", op=mpi_ops.Sum)).to(xhat.device)
            if sums.numel() != 2 * channels:
                raise ValueError("SyncBatchNorm backward: ranks disagree on the layer")
            mean_dy = (sums[:channels] / ctx.total).to(xhat.dtype)
            mean_dy_xhat = (sums[channels:] / ctx.total).to(xhat.dtype)
            scale = invstd if weight is None else invstd * weight.detach().to(xhat.dtype)
            grad = (dy - mean_dy.unsqueeze(1) - xhat * mean_dy_xhat.unsqueeze(1)) \
                * scale.unsqueeze(1)
            grad_input = _unview(grad, ctx.shape).to(ctx.input_dtype).contiguous()
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = local_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = local_dy.to(weight.dtype if weight is not None else xhat.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None


def _unview(tensor, shape):
    """(C, N * ...) -> (N, C, ...)."""
    moved = (shape[1], shape[0]) + tuple(shape[2:])
    return tensor.reshape(moved).transpose(0, 1)
