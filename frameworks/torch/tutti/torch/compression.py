"""Gradient compression applied around allreduce (horovod.torch.Compression)."""

import torch


class Compressor:
    """Interface: compress a tensor before the collective, restore it after."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context needed by decompress)."""
        raise NotImplementedError("Compressor subclasses implement compress()")

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored with the context from compress()."""
        raise NotImplementedError("Compressor subclasses implement decompress()")


class NoneCompressor(Compressor):
    """Sends tensors unchanged."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and restores their dtype afterwards."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class BF16Compressor(FP16Compressor):
    """Sends floating-point tensors as bfloat16 (float32's range, 8 bits of mantissa) and
    restores their dtype afterwards. Where fp16 overflows (gradients beyond 65504) bf16 does
    not; Tutti's CPU kernels reduce bfloat16 in float32 and round once per element."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.bfloat16:
            return tensor.to(torch.bfloat16), dtype
        return tensor, dtype


class Compression:
    """The available compressors: Compression.none, Compression.fp16 and Compression.bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
