"""Pytree helpers and the optax wrapper: what a data-parallel JAX training loop needs."""
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from tutti.jax import ops


def allreduce_gradients(grads, op: int = ops.Average, name: Optional[str] = None,
                        process_set=0):
    """Allreduces every leaf of a pytree of gradients as one group (one negotiation, fused);
    returns the same tree. Eagerly and inside jax.jit."""
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    if not leaves:
        return grads
    reduced = ops.grouped_allreduce(leaves, name=name, op=op, process_set=process_set)
    return jax.tree_util.tree_unflatten(treedef, reduced)


def broadcast_parameters(params, root_rank: int = 0, name: Optional[str] = None,
                         process_set=0):
    """The root's pytree of arrays on every rank (e.g. initial parameters or optimizer state).
    Returns a new tree of arrays (Python numbers among the leaves become arrays)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    base = name or "jax.broadcast_parameters"
    out = []
    for i, leaf in enumerate(leaves):
        out.append(ops.broadcast(jnp.asarray(leaf), root_rank, name="%s.%d" % (base, i),
                                 process_set=process_set))
    return jax.tree_util.tree_unflatten(treedef, out)


class DistributedState(NamedTuple):
    inner: Any          # the wrapped transformation's state
    accumulated: Any    # sum of the local gradients since the last step (a tree like params)
    count: Any          # backward passes accumulated, int32


def DistributedOptimizer(tx, backward_passes_per_step: int = 1, op: int = ops.Average,
                         name: Optional[str] = None, process_set=0):
    """Wraps an optax GradientTransformation: gradients are allreduced (one fused group) before
    `tx` sees them. With backward_passes_per_step=k, k calls to update accumulate the local
    gradients and return zero updates; the k-th allreduces their mean and applies `tx`
    (jax.lax.cond: every rank takes the same branch, so the collective stays matched)."""
    import optax

    k = int(backward_passes_per_step)
    if k < 1:
        raise ValueError("tutti.jax.DistributedOptimizer: backward_passes_per_step must be "
                         ">= 1, got %d" % k)
    base = name or "jax.DistributedOptimizer"

    if k == 1:
        def init_fn(params):
            return tx.init(params)

        def update_fn(grads, state, params=None):
            grads = allreduce_gradients(grads, op=op, name=base, process_set=process_set)
            return tx.update(grads, state, params)

        return optax.GradientTransformation(init_fn, update_fn)

    def init_fn(params):
        return DistributedState(tx.init(params), jax.tree_util.tree_map(jnp.zeros_like, params),
                                jnp.zeros((), jnp.int32))

    def update_fn(grads, state, params=None):
        acc = jax.tree_util.tree_map(lambda a, g: a + g, state.accumulated, grads)
        count = state.count + 1

        def apply(_):
            mean = jax.tree_util.tree_map(lambda a: a / k, acc)
            reduced = allreduce_gradients(mean, op=op, name=base, process_set=process_set)
            updates, inner = tx.update(reduced, state.inner, params)
            return updates, DistributedState(inner, jax.tree_util.tree_map(jnp.zeros_like, acc),
                                             jnp.zeros((), jnp.int32))

        def skip(_):
            return (jax.tree_util.tree_map(jnp.zeros_like, grads),
                    DistributedState(state.inner, acc, count))

        return jax.lax.cond(count >= k, apply, skip, None)

    return optax.GradientTransformation(init_fn, update_fn)


distributed = DistributedOptimizer
