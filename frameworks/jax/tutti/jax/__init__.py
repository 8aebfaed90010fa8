"""tutti.jax: Tutti's collectives for JAX, eagerly and inside jax.jit (docs/jax.md).

    import tutti.jax as tj
    tj.init()
    grads = tj.allreduce_gradients(grads)          # or inside a jitted train step
    tx = tj.DistributedOptimizer(optax.adam(1e-3))

The collectives run outside jit on the host through Tutti's C API and inside jit as XLA FFI
custom calls (libtutti_jax.so) that never block XLA's thread.
"""
from tutti.jax import _lib  # noqa: F401  (raises ImportError when built without jax)
from tutti.jax._lib import TuttiError  # noqa: F401
from tutti.jax.ops import *  # noqa: F401,F403
from tutti.jax.ops import __all__ as _ops_all
from tutti.jax.optimizer import (DistributedOptimizer, allreduce_gradients,  # noqa: F401
                                 broadcast_parameters, distributed)

__all__ = list(_ops_all) + ["DistributedOptimizer", "distributed", "allreduce_gradients",
                            "broadcast_parameters"]
