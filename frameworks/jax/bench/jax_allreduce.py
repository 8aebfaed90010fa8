"""tutti.jax.allreduce inside jax.jit against JAX's own cross-process CPU psum (gloo), in the
same job, on the same machine: median time per call and bus bandwidth per size.

    tuttirun -np 2 --gloo python frameworks/jax/bench/jax_allreduce.py [--sizes-mib 1,4,16,64]

Every rank starts Tutti, then jax.distributed (coordinator on rank 0, a free local port
broadcast through Tutti) with jax_cpu_collectives_implementation=gloo; each process owns one
CPU device of a global mesh, and JAX's psum runs under shard_map. busbw = 2 (n-1)/n * bytes / t
(the ring's traffic, as nccl-tests and docs/PERFORMANCE.md count it). Rank 0 prints one line
per size and op. docs/jax.md and docs/PERFORMANCE.md record the numbers.

--mpi4jax adds mpi4jax.allreduce from a jitted function (run the job under mpirun, in an
environment with mpi4jax: mpi4py initializes MPI before Tutti starts, and Tutti uses it).

--train-layers N adds a jitted data-parallel training step of an MLP (N square layers of
--train-width, SGD, a local batch of --train-batch per rank): Tutti's (grads allreduced with
tutti.jax.allreduce_gradients, one fused group) against JAX's (the same step under shard_map,
grads averaged with jax.lax.pmean over gloo). Both end with the same parameters on every rank,
which the script checks
(and that the two agree to 1e-2).
"""
import argparse
import os
import socket
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import tutti.jax as tj  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, x, iters, warmup):
    for _ in range(warmup):
        jax.block_until_ready(fn(x))
    times = []
    for _ in range(iters):
        tj.barrier()
        t = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t)
    # the slowest rank's median
    return max(tj.allgather_object(statistics.median(times)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", default="1,4,16,64")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mpi4jax", action="store_true")
    p.add_argument("--train-layers", type=int, default=0)
    p.add_argument("--train-width", type=int, default=1024)
    p.add_argument("--train-batch", type=int, default=32)
    args = p.parse_args()

    if args.mpi4jax:
        import mpi4jax  # before tj.init(): mpi4py initializes MPI
        from mpi4py import MPI
    tj.init()
    rank, size = tj.rank(), tj.size()
    port = tj.broadcast_object(free_port() if rank == 0 else None, 0)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize("127.0.0.1:%d" % port, num_processes=size, process_id=rank)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices()), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    psum = jax.jit(shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                             out_specs=P("i")))
    tutti = jax.jit(lambda v: tj.allreduce(v, op=tj.Sum, name="bench"))
    if args.mpi4jax:
        def _m4j(v):
            out = mpi4jax.allreduce(v, op=MPI.SUM, comm=MPI.COMM_WORLD)
            return out[0] if isinstance(out, tuple) else out  # (result, token) before 0.6
        m4j = jax.jit(_m4j)

    if rank == 0:
        print("ranks=%d jax=%s backend=%s" % (size, jax.__version__, jax.default_backend()))
        print("%8s %-10s %10s %12s" % ("MiB", "op", "ms", "busbw GB/s"))
    for mib in [float(s) for s in args.sizes_mib.split(",")]:
        count = int(mib * (1 << 20) // 4)
        local = jnp.full((count,), float(rank + 1), jnp.float32)
        out = tutti(local)
        assert float(out[0]) == size * (size + 1) / 2
        t_tutti = timed(tutti, local, args.iters, args.warmup)
        glob = jax.make_array_from_single_device_arrays(
            (count * size,), sharding, [jax.device_put(local, jax.local_devices()[0])])
        out = psum(glob)
        assert float(out.addressable_shards[0].data[0]) == size * (size + 1) / 2
        t_psum = timed(psum, glob, args.iters, args.warmup)
        nbytes = count * 4
        rows = [("tutti", t_tutti), ("jax-gloo", t_psum)]
        if args.mpi4jax:
            out = m4j(local)
            assert float(out[0]) == size * (size + 1) / 2
            rows.append(("mpi4jax", timed(m4j, local, args.iters, args.warmup)))
        for name, t in rows:
            busbw = 2 * (size - 1) / size * nbytes / t / 1e9
            if rank == 0:
                print("%8.1f %-10s %10.2f %12.3f" % (mib, name, t * 1e3, busbw))
        if rank == 0:
            print("%8.1f %-10s %10.2fx" % (mib, "ratio", t_psum / t_tutti))
            if args.mpi4jax:
                print("%8.1f %-10s %10.2fx" % (mib, "vs mpi4jax", rows[2][1] / t_tutti))
    if args.train_layers:
        train(args, mesh, sharding, shard_map, P, rank, size)
    jax.distributed.shutdown()
    tj.shutdown()


def train(args, mesh, sharding, shard_map, P, rank, size):
    from jax.sharding import NamedSharding
    w, layers, batch = args.train_width, args.train_layers, args.train_batch
    key = jax.random.PRNGKey(0)  # the same initial parameters everywhere
    params = [jax.random.normal(k, (w, w), jnp.float32) / np.sqrt(w)
              for k in jax.random.split(key, layers)]
    x = jax.random.normal(jax.random.PRNGKey(1 + rank), (batch, w), jnp.float32)
    y = jnp.roll(x, 1, axis=1)

    def loss(ps, x, y):
        h = x
        for p_ in ps:
            h = jnp.tanh(h @ p_)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def tutti_step(ps, x, y):
        g = tj.allreduce_gradients(jax.grad(loss)(ps, x, y), name="bench.train")
        return [p_ - 0.1 * g_ for p_, g_ in zip(ps, g)]

    def local_step(ps, x, y):
        g = jax.lax.pmean(jax.grad(loss)(ps, x, y), "i")
        return [p_ - 0.1 * g_ for p_, g_ in zip(ps, g)]

    jax_step = jax.jit(shard_map(local_step, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                                 out_specs=P()))
    replicated = NamedSharding(mesh, P())
    dev = jax.local_devices()[0]

    def glob(a):
        return jax.make_array_from_single_device_arrays(
            (a.shape[0] * size,) + a.shape[1:], sharding, [jax.device_put(a, dev)])

    gps = [jax.make_array_from_single_device_arrays(p_.shape, replicated,
                                                    [jax.device_put(p_, dev)]) for p_ in params]
    gx, gy = glob(x), glob(y)

    def run_tutti(state):
        return tutti_step(state, x, y)

    def run_jax(state):
        return jax_step(state, gx, gy)

    results = {}
    for name, fn, state in (("tutti", run_tutti, params), ("jax-gloo", run_jax, gps)):
        for _ in range(args.warmup):
            state = jax.block_until_ready(fn(state))
        times = []
        for _ in range(args.iters):
            tj.barrier()
            t = time.perf_counter()
            state = jax.block_until_ready(fn(state))
            times.append(time.perf_counter() - t)
        results[name] = (max(tj.allgather_object(statistics.median(times))), state)
    # identical parameters on every rank, and the two implementations agree
    mine = np.asarray(results["tutti"][1][0])
    assert all(np.array_equal(mine, o) for o in tj.allgather_object(mine))
    theirs = np.asarray(results["jax-gloo"][1][0].addressable_shards[0].data)
    # the two sum float32 gradients in different orders: close, not equal
    drift = float(np.max(np.abs(mine - theirs)))
    assert drift < 1e-2, "tutti and JAX's step disagree by %g" % drift
    if rank == 0:
        nparams = layers * w * w
        print("train step: %d layers x %d^2 (%.1f MiB of gradients), batch %d per rank"
              % (layers, w, nparams * 4 / 2**20, batch))
        for name in ("tutti", "jax-gloo"):
            print("%-10s %10.2f ms/step" % (name, results[name][0] * 1e3))
        print("%-10s %10.2fx" % ("ratio", results["tutti"][0] / results["jax-gloo"][0]))
        print("parameters: identical on every rank; tutti vs jax-gloo differ by %.2g" % drift)


if __name__ == "__main__":
    main()
