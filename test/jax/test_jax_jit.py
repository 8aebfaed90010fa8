"""tutti.jax inside jax.jit: ordering, gradients (custom VJPs against the analytic form), vmap,
a jitted MLP training step, and what goes wrong (mismatches, unsupported dtypes, no init)."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tutti.jax as tj


def test_many_independent_ops_in_one_jit(rank, size):
    """Independent collectives of one jitted function, named and unnamed: XLA keeps
    side-effecting custom calls in program order, every rank traces the same program, so every
    rank issues them in the same order (docs/jax.md, "jit semantics")."""
    @jax.jit
    def f(x):
        named = {n: tj.allreduce(x * (1 + i), name=n, op=tj.Sum)
                 for i, n in enumerate(["order.a", "order.b", "order.c"])}
        unnamed = [tj.allreduce(x + i, op=tj.Sum) for i in range(3)]
        return named, unnamed, tj.allgather(x), tj.broadcast(x * rank, 0)

    for _ in range(2):  # and the same names again on a second run
        named, unnamed, gathered, bcast = f(jnp.ones(4))
        for i, n in enumerate(["order.a", "order.b", "order.c"]):
            np.testing.assert_allclose(np.asarray(named[n]), (1 + i) * size)
            np.testing.assert_allclose(np.asarray(unnamed[i]), (1 + i) * size)
        assert gathered.shape == (4 * size,)
        np.testing.assert_allclose(np.asarray(bcast), 0.0)


def _token_chain(jaxpr):
    """The int32 token operand and result of each Tutti op at the top level of a jaxpr."""
    chain = []
    for e in jaxpr.eqns:
        if e.primitive.name == "custom_vjp_call":
            ins = [v for v in e.invars if str(v.aval) == "int32[]"]
            outs = [v for v in e.outvars if str(v.aval) == "int32[]"]
            chain.append((ins[-1], outs[-1]))
    return chain


def test_forward_and_backward_ops_form_one_chain(rank, size):
    """Every collective of a gradient computation, forward and backward, is chained by the
    ordering token: the backward ops (whose inputs need not depend on the forward ops'
    results: here the loss is linear) cannot be issued before the forward ones."""
    def f(x):
        a = tj.allreduce(x * (rank + 1), op=tj.Sum)
        b = tj.allgather(x)
        c = tj.broadcast(x, 0)
        return 3 * jnp.sum(a) + jnp.sum(b) + jnp.sum(c) * rank

    chain = _token_chain(jax.make_jaxpr(jax.grad(f))(jnp.ones(3)).jaxpr)
    assert len(chain) == 6, chain  # 3 forward, 3 backward
    for (_, prev_out), (next_in, _) in zip(chain, chain[1:]):
        assert next_in is prev_out, chain
    g = jax.jit(jax.grad(f))(jnp.ones(3))
    # Horovod's gradients: Sum-allreduce of 3, times rank + 1; the allgather's own rows of an
    # averaged 1; the broadcast's averaged cotangent (the ranks' mean) on the root only
    want = 3 * size * (rank + 1) + 1 + ((size - 1) / 2 if rank == 0 else 0)
    np.testing.assert_allclose(np.asarray(g), want)


def test_unused_result_is_still_issued(rank, size):
    """has_side_effect: an op whose result is unused still runs (else the peer would hang)."""
    @jax.jit
    def f(x):
        tj.allreduce(x, name="unused.result", op=tj.Sum)
        return x + 1

    np.testing.assert_allclose(np.asarray(f(jnp.ones(2))), 2)
    # a matching eager op on a second name proves both ranks are still in step
    assert float(tj.allreduce(jnp.float32(1), op=tj.Sum)) == size


def test_calls_dispatched_without_waiting(size):
    """JAX dispatches jitted calls asynchronously: eight calls of one function (one tensor
    name) issued before any result is read still run one after the other, each matched."""
    f = jax.jit(lambda x: tj.allreduce(x, op=tj.Sum, name="async.dispatch"))
    outs = [f(jnp.full((1 << 16,), float(i))) for i in range(8)]
    for i, o in enumerate(outs):
        assert float(o[0]) == i * size


def test_grad_without_jit(rank, size):
    g = jax.grad(lambda x: jnp.sum(tj.allreduce(x, op=tj.Sum) * 2))(jnp.ones(3) * rank)
    np.testing.assert_allclose(np.asarray(g), 2 * size)


def test_fori_loop(size):
    @jax.jit
    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, v: tj.allreduce(v, op=tj.Sum), x)

    np.testing.assert_allclose(np.asarray(f(jnp.ones(3))), float(size) ** 3)


def test_grad_allreduce(rank, size):
    x = jnp.arange(3.0) + rank
    g = jax.jit(jax.grad(lambda x: jnp.sum(tj.allreduce(x, op=tj.Sum) ** 2)))(x)
    y = sum(np.arange(3.0) + r for r in range(size))
    np.testing.assert_allclose(np.asarray(g), size * 2 * y)
    g = jax.grad(jax.jit(lambda x: jnp.sum(tj.allreduce(x, op=tj.Average) * 3)))(x)
    np.testing.assert_allclose(np.asarray(g), 3.0)


def test_grad_grouped_allreduce(rank, size):
    def loss(a, b):
        ra, rb = tj.grouped_allreduce([a, b], op=tj.Sum)
        return jnp.sum(ra) + 2 * jnp.sum(rb)

    ga, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.ones(2), jnp.ones(3))
    np.testing.assert_allclose(np.asarray(ga), size)
    np.testing.assert_allclose(np.asarray(gb), 2 * size)


def test_grad_allgather(rank, size):
    x = jnp.ones((rank + 1, 2))
    w = jnp.arange(sum(r + 1 for r in range(size)) * 2.0).reshape(-1, 2)
    g = jax.jit(jax.grad(lambda x: jnp.sum(tj.allgather(x) * w)))(x)
    start = sum(r + 1 for r in range(rank))
    # Average-allreduce of identical incoming gradients (w), sliced to this rank's rows
    np.testing.assert_allclose(np.asarray(g), np.asarray(w)[start:start + rank + 1])


def test_grad_broadcast(rank, size):
    g = jax.jit(jax.grad(lambda x: jnp.sum(tj.broadcast(x, 0) * (rank + 1))))(jnp.ones(3))
    mean = np.mean([r + 1 for r in range(size)])
    np.testing.assert_allclose(np.asarray(g), mean if rank == 0 else 0.0)


def test_grad_reducescatter(rank, size):
    rows = 2 * size + 1
    g = jax.jit(jax.grad(lambda x: jnp.sum(tj.reducescatter(x, op=tj.Sum) ** 1)))(
        jnp.ones((rows, 2)))
    # allgather of ones, times the set size for Sum
    np.testing.assert_allclose(np.asarray(g), size * np.ones((rows, 2)))


def test_grad_alltoall(rank, size):
    splits = [1 + i for i in range(size)]
    x = jnp.ones((sum(splits), 2))
    g = jax.jit(jax.grad(lambda x: jnp.sum(tj.alltoall(x, splits=splits)[0] * 3)))(x)
    np.testing.assert_allclose(np.asarray(g), 3.0)


def test_grad_finite_differences(rank, size):
    """d/dx of a nonlinear function of an allreduce against central differences. Horovod's
    convention (tutti.torch's too): a rank's gradient is that of the sum of every rank's loss
    with respect to its own input, i.e. size times d(loss)/d(own x) here, where every rank
    computes the same loss. Each rank in turn perturbs its input while the others hold."""
    def f(x):
        return jnp.sum(jnp.sin(tj.allreduce(x * x, op=tj.Average)))

    x = jnp.array([0.3, -0.2, 0.5], dtype=jnp.float64) * (rank + 1)
    g = np.asarray(jax.jit(jax.grad(f))(x))
    ff = jax.jit(f)
    eps = 1e-6
    for k in range(size):
        for i in range(3):
            e = np.zeros(3)
            if rank == k:
                e[i] = eps
            fd = (float(ff(x + e)) - float(ff(x - e))) / (2 * eps)
            if rank == k:
                np.testing.assert_allclose(g[i], size * fd, rtol=1e-5, atol=1e-8)


def test_vmap(rank, size):
    xs = jnp.stack([jnp.arange(3.0) + rank, jnp.ones(3)])
    out = jax.jit(jax.vmap(lambda x: tj.allreduce(x, op=tj.Sum)))(xs)
    np.testing.assert_allclose(np.asarray(out[1]), size)
    # allgather, alltoall, reducescatter: one collective per batch element, in turn
    X = jnp.arange(6.0).reshape(3, 2, 1) + 100 * rank
    out = jax.jit(jax.vmap(tj.allgather))(X)
    want = np.stack([np.concatenate([np.asarray(X[b]) + 100 * (k - rank) for k in range(size)])
                     for b in range(3)])
    np.testing.assert_allclose(np.asarray(out), want)
    rs = jax.jit(jax.vmap(lambda v: tj.reducescatter(v, op=tj.Sum)))(jnp.ones((3, 2 * size, 2)))
    assert rs.shape == (3, 2, 2)
    np.testing.assert_allclose(np.asarray(rs), size)
    a2 = jax.jit(jax.vmap(tj.alltoall))(jnp.ones((3, 2 * size)) * rank)
    np.testing.assert_allclose(np.asarray(a2[0]), np.repeat(np.arange(size), 2))


def test_mlp_training_identical_parameters(rank, size):
    """A jitted training step of a small MLP on rank-dependent synthetic data: after training,
    every rank holds the same parameters."""
    key = jax.random.PRNGKey(rank)  # different initial parameters on every rank
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (4, 8)), "b1": jnp.zeros(8),
              "w2": jax.random.normal(k2, (8, 1)), "b2": jnp.zeros(1)}
    params = tj.broadcast_parameters(params, root_rank=0)
    tx = tj.DistributedOptimizer(optax.adam(1e-2))
    opt_state = tx.init(params)

    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, s, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, l

    data = jax.random.normal(jax.random.PRNGKey(100 + rank), (16, 4))
    target = jnp.sum(data, axis=1, keepdims=True)
    first = None
    for _ in range(8):
        params, opt_state, l = step(params, opt_state, data, target)
        first = l if first is None else first
    gathered = tj.allgather_object(jax.tree_util.tree_map(np.asarray, params))
    for other in gathered:
        for k in params:
            np.testing.assert_array_equal(other[k], np.asarray(params[k]))
    assert float(l) < float(first)


def test_backward_passes_per_step(rank, size):
    tx = tj.DistributedOptimizer(optax.sgd(1.0), backward_passes_per_step=2)
    p = jnp.zeros(2)
    s = tx.init(p)
    upd = jax.jit(tx.update)
    u, s = upd(jnp.ones(2) * (rank + 1), s, p)
    np.testing.assert_allclose(np.asarray(u), 0.0)  # first pass: accumulated only
    u, s = upd(jnp.ones(2) * (rank + 1), s, p)
    np.testing.assert_allclose(np.asarray(u), -np.mean([r + 1 for r in range(size)]))


def test_mismatch_raises_on_every_rank(rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    x = jnp.ones(3 + rank)  # a different shape on every rank
    with pytest.raises(tj.TuttiError) as eager:
        tj.allreduce(x, name="mismatch.eager")
    msg = str(eager.value)
    assert "mismatch.eager" in msg and "allreduce" in msg and "rank" in msg, msg
    with pytest.raises(Exception) as traced:
        jax.block_until_ready(jax.jit(lambda v: tj.allreduce(v, name="mismatch.jit"))(x))
    msg = str(traced.value)
    assert "mismatch.jit" in msg and "allreduce" in msg and "rank" in msg, msg
    # Tutti is still usable afterwards
    assert float(tj.allreduce(jnp.float32(1), op=tj.Sum)) == size


def test_unsupported_dtype_refused_at_trace_time():
    with pytest.raises(TypeError, match="complex64"):
        jax.jit(tj.allreduce).lower(jnp.ones(2, jnp.complex64))
    with pytest.raises(TypeError, match="uint32"):
        tj.allgather(jnp.ones(2, jnp.uint32))


def test_op_before_init_says_so(rank):
    if rank != 0:
        pytest.skip("a fresh process without Tutti; once per job is enough")
    code = ("import jax.numpy as jnp, tutti.jax as tj\n"
            "try:\n    tj.allreduce(jnp.ones(2))\nexcept ValueError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "TUTTI_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert "allreduce called before tutti.jax.init()" in out.stdout, out.stdout + out.stderr


def test_barrier_join_in_jit(rank, size):
    @jax.jit
    def step(x):
        y = tj.allreduce(x, op=tj.Sum, name="jit.barrier.before")
        tj.barrier()
        last = tj.join()
        return tj.allreduce(y, op=tj.Sum, name="jit.barrier.after"), last

    out, last = step(jnp.ones(3, jnp.float32))
    np.testing.assert_allclose(np.asarray(out), np.full(3, size * size, np.float32))
    assert last.dtype == jnp.int32 and last.shape == () and int(last) in range(size)
    out, last = step(jnp.ones(3, jnp.float32))  # the compiled function again
    assert int(last) in range(size)
    assert tj.join() in range(size)  # eager still returns an int
    assert isinstance(tj.join(), int)
    tj.barrier()


def test_barrier_in_jit_waits(rank, size):
    import time

    @jax.jit
    def wait(x):
        tj.barrier()
        return x + 1

    hlo = wait.lower(jnp.int32(0)).as_text()
    assert "tutti_barrier" in hlo
    wait(jnp.int32(0))  # compiled, and every rank is here
    if rank == 0:
        time.sleep(0.3)
    t0 = time.monotonic()
    assert int(wait(jnp.int32(1))) == 2
    if size > 1 and rank != 0:
        assert time.monotonic() - t0 > 0.2  # waited for rank 0


def test_allreduce_of_an_intermediate_runs_in_place(rank, size):
    # allreduce, grouped_allreduce and broadcast let XLA give them one buffer for operand and
    # result (no fresh output buffer for a gradient); the operand the caller keeps is intact.
    def step(x):
        g = x * 2.0
        a = tj.allreduce(g, op=tj.Sum, name="inplace.a")
        b, c = tj.grouped_allreduce([g + 1.0, g - 1.0], op=tj.Sum, name="inplace.g")
        d = tj.broadcast(g * 3.0, 0, name="inplace.b")
        return a, b, c, d

    compiled = jax.jit(step).lower(jnp.ones(3)).compile().as_text()
    calls = [line for line in compiled.splitlines()
             if "custom_call_target=\"tutti_" in line]
    assert len(calls) == 3 and all("output_to_operand_aliasing" in c for c in calls), calls
    x = jnp.arange(3.0) + rank
    a, b, c, d = jax.jit(step)(x)
    total = sum(np.arange(3.0) + r for r in range(size)) * 2.0
    np.testing.assert_allclose(np.asarray(a), total)
    np.testing.assert_allclose(np.asarray(b), total + size)
    np.testing.assert_allclose(np.asarray(c), total - size)
    np.testing.assert_allclose(np.asarray(d), np.arange(3.0) * 6.0)
    np.testing.assert_allclose(np.asarray(x), np.arange(3.0) + rank)  # the caller's operand
