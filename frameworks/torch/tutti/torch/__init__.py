"""tutti.torch: Tutti collectives for PyTorch, a drop-in for horovod.torch.

    import tutti.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

See docs/pytorch.md.
"""

# Before anything loads the extension _C: is it built for the torch this interpreter imports?
from tutti.torch import _extension  # noqa: E402
_extension.check()

import torch  # noqa: E402,F401  (loads libtorch before the extension)

from tutti import __version__
from tutti.torch.basics import (
    DuplicateNameError, HorovodInternalError, ProcessSet, TuttiError, TuttiTimeoutError,
    TuttiValueError, add_process_set, ccl_built, cpu_backend, cross_rank, cross_size,
    cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, nccl_enabled, rank, remove_process_set, rocm_built,
    shutdown, size, start_timeline, stats, stop_timeline)
from tutti.torch.compression import Compression
from tutti.torch.mpi_ops import (
    Adasum, Average, Handle, Max, Min, Product, Sum, allgather_async, allreduce_,
    allreduce_async, allreduce_async_, alltoall_async, barrier, broadcast_, broadcast_async,
    broadcast_async_, grouped_allgather_async, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter_async, join, poll, reducescatter_async,
    sparse_allreduce_async, synchronize)
from tutti.torch.autograd import (
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, reducescatter)
from tutti.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from tutti.torch.optimizer import DistributedOptimizer
from tutti.torch.sync_batch_norm import SyncBatchNorm
from tutti.torch import elastic  # noqa: E402  (docs/elastic.md)
# Registers the torch.distributed backend "tutti" (docs/pytorch.md, "torch.distributed backend").
from tutti.torch import distributed  # noqa: E402,F401
from tutti.torch.elastic import HostsUpdatedInterrupt

# horovod.torch names Tutti does not have. Using one raises an error that says what to do
# instead: an AttributeError, so that hasattr() is False and getattr(hvd, name, None) is None
# (feature detection), which is also a NotImplementedError.
_NOT_BUILT = {
    "mpi_lib": "tutti.torch has no mpi_lib extension; its native module is tutti.torch._C",
}


class NotBuiltError(AttributeError, NotImplementedError):
    """A horovod.torch name that Tutti does not have (hasattr() answers False)."""


def __getattr__(name):
    if name in _NOT_BUILT:
        raise NotBuiltError("tutti.torch.%s: %s (docs/pytorch.md, \"Differences from "
                            "horovod.torch\")" % (name, _NOT_BUILT[name]))
    raise AttributeError("module 'tutti.torch' has no attribute %r" % name)


__all__ = [
    "Adasum", "add_process_set", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "Average", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "ccl_built", "Compression", "cpu_backend", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "DistributedOptimizer", "DuplicateNameError",
    "elastic",
    "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "Handle",
    "HorovodInternalError", "HostsUpdatedInterrupt", "init", "is_homogeneous", "is_initialized", "join", "local_rank",
    "local_size", "Max", "Min", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "nccl_enabled", "poll", "ProcessSet", "Product", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stats", "stop_timeline", "Sum", "synchronize",
    "SyncBatchNorm", "TuttiError", "TuttiTimeoutError", "TuttiValueError", "__version__",
]
