"""What tutti.keras' jax and torch backend layers share: the optimizer's gradient reduction
over an adapter's grouped_allreduce, and gradient compression with keras.ops. (On TensorFlow
tutti.tensorflow's own gradient reduction is used, which also handles IndexedSlices.)"""

import keras


def make_allreduce_grads(adapter, set_size, name, compression, op, gradient_predivide_factor,
                         process_set):
    """fn(grads) -> the gradients reduced over the set in one grouped allreduce of the
    adapter (a module with grouped_allreduce, Average, Sum); None stays None. set_size(ps):
    the number of ranks in the process set."""
    if op not in (adapter.Average, adapter.Sum, adapter.Min, adapter.Max, adapter.Product):
        raise NotImplementedError("tutti.keras.DistributedOptimizer on the Keras %s backend: "
                                  "op %r is not one of Average, Sum, Min, Max, Product "
                                  "(docs/keras.md)" % (keras.backend.backend(), op))
    if gradient_predivide_factor != 1.0 and op != adapter.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")

    def allreduce_grads(grads):
        grads = list(grads)
        index = [i for i, g in enumerate(grads) if g is not None]
        if not index:
            return grads
        prescale, postscale, reduce_op = 1.0, 1.0, op
        if gradient_predivide_factor != 1.0:
            reduce_op = adapter.Sum
            prescale = 1.0 / gradient_predivide_factor
            postscale = gradient_predivide_factor / set_size(process_set)
        compressed, contexts = zip(*[compression.compress(grads[i]) for i in index])
        reduced = adapter.grouped_allreduce(list(compressed), name=name, op=reduce_op,
                                            prescale_factor=prescale,
                                            postscale_factor=postscale,
                                            process_set=process_set)
        out = list(grads)
        for i, r, ctx in zip(index, reduced, contexts):
            out[i] = compression.decompress(r, ctx)
        return out

    return allreduce_grads


class _CastCompressor:
    """Sends floating-point tensors as `dtype` and restores their dtype afterwards."""

    dtype = None

    @classmethod
    def compress(cls, tensor):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if cls.dtype is None or "float" not in dtype or dtype == cls.dtype:
            return tensor, None
        return keras.ops.cast(tensor, cls.dtype), dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else keras.ops.cast(tensor, ctx)


class NoneCompressor(_CastCompressor):
    """Sends tensors unchanged."""


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16."""

    dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (float32's range, 8 bits of mantissa)."""

    dtype = "bfloat16"


class Compression:
    """The available compressors: Compression.none, Compression.fp16 and Compression.bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
