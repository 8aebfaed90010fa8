"""Shared setup of the tutti.jax tests: every rank runs the same tests in the same order.

Tutti is initialized once per process (from the launcher's environment; a plain `pytest` is a
world of one) and shut down when the session ends. 64-bit types are enabled so that float64 and
int64 are tested as themselves.
"""
import os

# Up to 3 ranks share 2 cores: one XLA compute thread each.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

import tutti.jax as tj  # noqa: E402

tj.init()

FLOAT_DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64]
INT_DTYPES = [jnp.int32, jnp.int64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [jnp.bool_]


def pytest_sessionfinish(session, exitstatus):
    tj.shutdown()


def rank_values(rank, shape, dtype):
    """A deterministic array that differs per rank, with small values exact in every dtype."""
    n = int(np.prod(shape)) if shape else 1
    base = (np.arange(n, dtype=np.int64) * 5 + 3 * rank + 1) % 7
    if dtype == jnp.bool_:
        return jnp.asarray((base % 2 == 1).reshape(shape))
    return jnp.asarray((base - 3).reshape(shape)).astype(dtype)


def all_rank_values(shape, dtype):
    return [np.asarray(rank_values(r, shape, dtype)) for r in range(tj.size())]


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float64))


@pytest.fixture
def rank():
    return tj.rank()


@pytest.fixture
def size():
    return tj.size()
