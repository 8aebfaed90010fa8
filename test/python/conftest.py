"""Shared setup of the tutti.torch tests: every rank runs the same tests in the same order.

Tutti is initialized once per process (from the launcher's environment; a plain `pytest`
is a world of one) and shut down when the session ends.
"""

import pytest
import torch

import tutti.torch as hvd

hvd.init()
# Up to 3 ranks share 2 cores: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)

# Every dtype the runtime supports, as torch dtypes.
ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def pytest_sessionfinish(session, exitstatus):
    hvd.shutdown()


def rank_values(rank, shape, dtype):
    """A deterministic tensor that differs per rank, with small values exact in every dtype
    (non-negative for unsigned and bool types)."""
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) * 5 + 3 * rank + 1) % 7
    if dtype == torch.bool:
        return (base % 2 == 1).reshape(shape)
    if dtype != torch.uint8:
        base = base - 3
    return base.reshape(shape).to(dtype)


def all_rank_values(shape, dtype, world=None):
    world = hvd.size() if world is None else world
    return [rank_values(r, shape, dtype) for r in range(world)]


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()
