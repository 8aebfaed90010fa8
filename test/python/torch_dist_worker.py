"""One rank of a torch.distributed job on the backend "tutti" (test_torch_distributed.py).

    torch_dist_worker.py MODE [--rank R --size N --init-method URL]

Without --init-method the process group is made the way a launcher's rank makes it:
init_process_group(backend) alone (env://: torchrun's variables, or those importing tutti.torch
sets under tuttirun and mpirun). Modes:
  collectives  every collective against a reference computed here, Work and Future, refusals
  ddp          DDP training on each of --backends (tutti,gloo,tutti: destroy and re-init): the
               parameters must agree (bit for bit at 2 ranks; at more, within 1e-6); --save
               writes the first run's for comparison with another job
  fsdp         the same with FSDP2 (fully_shard on each layer and the model) instead of DDP
  kill         DDP training in which rank 1 kills itself at step 3: the others must fail
               naming rank 1 (exit 3 with "FAILED AS EXPECTED: <error>")
  mismatch     rank 0 calls all_reduce where the others call broadcast: an error, not a hang
               (with --subgroup, at 3 ranks: on the group of ranks 0 and 2; rank 1 idles)
  groups       groups of some ranks (new_group, new_subgroups_by_enumeration, new_subgroups,
               DeviceMesh) at 3 or 4 ranks, checked against references computed here, while
               the ranks outside a group do nothing; monitored_barrier, passing and naming
               the ranks that did not come; with --tutti-init (under tuttirun) Tutti runs
               first and destroy_process_group() must remove the groups' process sets
Prints "OK <mode>" at the end; any failure exits non-zero.
"""

import argparse
import datetime
import faulthandler
import gc
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist

import tutti.torch  # noqa: F401  registers the backend "tutti"

ARGS = None


INITS = [0]  # process groups made so far


def init(backend):
    kwargs = {}
    if ARGS.init_method:
        url = ARGS.init_method
        if url.startswith("tcp://") and INITS[0] > 0:  # a fresh port for each init
            host, port = url[len("tcp://"):].rsplit(":", 1)
            url = "tcp://%s:%d" % (host, int(port) + INITS[0])
        kwargs = dict(init_method=url, rank=ARGS.rank, world_size=ARGS.size)
    INITS[0] += 1
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=ARGS.timeout), **kwargs)
    assert dist.get_backend() == backend, dist.get_backend()


def values(rank, n, dtype):
    """Rank `rank`'s input: small positive values, distinct per rank."""
    v = (torch.arange(n) % 5 + rank + 1)
    if dtype == torch.bool:
        return (v + rank) % 2 == 0
    return v.to(dtype)


def reference(op, tensors):
    out = tensors[0].clone()
    for t in tensors[1:]:
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:
            out = out + t
        elif op == dist.ReduceOp.PRODUCT:
            out = out * t
        elif op == dist.ReduceOp.MIN:
            out = torch.minimum(out, t)
        elif op == dist.ReduceOp.MAX:
            out = torch.maximum(out, t)
        elif op == dist.ReduceOp.BAND:
            out = out & t
        elif op == dist.ReduceOp.BOR:
            out = out | t
        elif op == dist.ReduceOp.BXOR:
            out = out ^ t
    if op == dist.ReduceOp.AVG:
        out = out / len(tensors)
    return out.to(tensors[0].dtype)


def same(got, want, what):
    if got.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        torch.testing.assert_close(got, want, msg=lambda m: "%s: %s" % (what, m))
    elif not torch.equal(got, want):
        raise AssertionError("%s: got %s, want %s" % (what, got.tolist(), want.tolist()))


def refused(fn, *words):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any error will do; its message is checked
        text = str(e)
        for w in words:
            assert w in text, "expected %r in the error: %s" % (w, text)
        return
    raise AssertionError("expected an error naming %s" % (words,))


def collectives():
    init("tutti")
    r, n = dist.get_rank(), dist.get_world_size()
    ints = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    floats = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    for dtype in ints + floats + [torch.bool]:
        dtype_ops = list(ops) if dtype != torch.bool else [dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype in floats:
            dtype_ops.append(dist.ReduceOp.AVG)
        if dtype in ints or dtype == torch.bool:
            dtype_ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
        for op in dtype_ops:
            t = values(r, 11, dtype)
            dist.all_reduce(t, op=op)
            same(t, reference(op, [values(i, 11, dtype) for i in range(n)]),
                 "all_reduce %s %s" % (dtype, op))
    # A non-contiguous tensor, PREMUL_SUM, reduce to a root.
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    view = base.t()
    dist.all_reduce(view)
    same(base, sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) + i for i in range(n)),
         "all_reduce of a transposed view")
    if hasattr(dist, "_make_nccl_premul_sum"):
        t = values(r, 6, torch.float64)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        same(t, 0.5 * reference(dist.ReduceOp.SUM, [values(i, 6, torch.float64)
                                                      for i in range(n)]), "PREMUL_SUM")
    root = 1 % n
    t = values(r, 7, torch.int32)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if r == root:
        same(t, reference(dist.ReduceOp.MAX, [values(i, 7, torch.int32) for i in range(n)]),
             "reduce")
    t = values(r, 7, torch.int64)
    dist.reduce(t, dst=0, op=dist.ReduceOp.BXOR)
    if r == 0:
        same(t, reference(dist.ReduceOp.BXOR, [values(i, 7, torch.int64) for i in range(n)]),
             "reduce BXOR")
    # Broadcast, gathers, scatter.
    t = values(r, 5, torch.float32)
    dist.broadcast(t, src=n - 1)
    same(t, values(n - 1, 5, torch.float32), "broadcast")
    outs = [torch.zeros(2, 3, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(outs, values(r, 6, torch.float64).reshape(2, 3))
    for i in range(n):
        same(outs[i], values(i, 6, torch.float64).reshape(2, 3), "all_gather %d" % i)
    whole = torch.zeros(n * 4, dtype=torch.int16)
    dist.all_gather_into_tensor(whole, values(r, 4, torch.int16))
    same(whole, torch.cat([values(i, 4, torch.int16) for i in range(n)]),
         "all_gather_into_tensor")
    # Coalesced gathers and reduce-scatters (FSDP uses the last two).
    outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(n)]  # outs[rank][input]
    dist.all_gather_coalesced(outs, [values(r, 2, torch.float32), values(r + 5, 3, torch.float32)])
    for i in range(n):
        same(outs[i][0], values(i, 2, torch.float32), "all_gather_coalesced")
        same(outs[i][1], values(i + 5, 3, torch.float32), "all_gather_coalesced")
    from torch.distributed.distributed_c10d import _coalescing_manager
    a, b = torch.zeros(2 * n), torch.zeros(3 * n)
    with _coalescing_manager():
        dist.all_gather_into_tensor(a, values(r, 2, torch.float32))
        dist.all_gather_into_tensor(b, values(r, 3, torch.float32))
    same(a, torch.cat([values(i, 2, torch.float32) for i in range(n)]), "coalesced gather a")
    same(b, torch.cat([values(i, 3, torch.float32) for i in range(n)]), "coalesced gather b")
    a, b = torch.zeros(2), torch.zeros(3)
    with _coalescing_manager():
        dist.reduce_scatter_tensor(a, values(r, 2 * n, torch.float32))
        dist.reduce_scatter_tensor(b, values(r + 1, 3 * n, torch.float32))
    same(a, sum(values(i, 2 * n, torch.float32) for i in range(n))[2 * r:2 * r + 2],
         "coalesced reduce_scatter a")
    same(b, sum(values(i + 1, 3 * n, torch.float32) for i in range(n))[3 * r:3 * r + 3],
         "coalesced reduce_scatter b")
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "text": "x" * (r + 1)})
    assert objs == [{"rank": i, "text": "x" * (i + 1)} for i in range(n)], objs
    gathered = [torch.zeros(3) for _ in range(n)] if r == 0 else None
    dist.gather(values(r, 3, torch.float32), gather_list=gathered, dst=0)
    if r == 0:
        for i in range(n):
            same(gathered[i], values(i, 3, torch.float32), "gather %d" % i)
    out = torch.zeros(4, dtype=torch.int64)
    chunks = [values(10 + i, 4, torch.int64) for i in range(n)] if r == n - 1 else None
    dist.scatter(out, scatter_list=chunks, src=n - 1)
    same(out, values(10 + r, 4, torch.int64), "scatter")
    # Reduce-scatter.
    out = torch.zeros(3)
    dist.reduce_scatter(out, [values(r, 3, torch.float32) * (j + 1) for j in range(n)])
    same(out, sum(values(i, 3, torch.float32) * (r + 1) for i in range(n)), "reduce_scatter")
    out = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, values(r, 2 * n, torch.float64), op=dist.ReduceOp.MAX)
    want = reference(dist.ReduceOp.MAX, [values(i, 2 * n, torch.float64) for i in range(n)])
    same(out, want[2 * r:2 * r + 2], "reduce_scatter_tensor")
    # All-to-all: lists, and one tensor with uneven splits (rank i sends i+j+1 rows to j).
    outs = [torch.zeros(2, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([r, j], dtype=torch.int32) for j in range(n)])
    for i in range(n):
        same(outs[i], torch.tensor([i, r], dtype=torch.int32), "all_to_all from %d" % i)
    send = [r + j + 1 for j in range(n)]
    recv = [i + r + 1 for i in range(n)]
    inp = torch.cat([torch.full((send[j], 2), 100.0 * r + j) for j in range(n)])
    out = torch.zeros(sum(recv), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    same(out, torch.cat([torch.full((recv[i], 2), 100.0 * i + r) for i in range(n)]),
         "all_to_all_single uneven")
    out = torch.zeros(n)
    dist.all_to_all_single(out, torch.arange(n, dtype=torch.float32) + 10 * r)
    same(out, torch.tensor([10.0 * i + r for i in range(n)]), "all_to_all_single even")
    dist.barrier()
    # Work and its Future.
    t = torch.ones(1000) * (r + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert work.wait() is True
    assert work.is_completed()
    result = fut.wait()
    same(result[0], torch.ones(1000) * (n * (n + 1) / 2), "future's value")
    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    same(chained.wait(), torch.ones(3) * 2 * n, "future.then")
    # What it refuses, naming what is missing (no collective starts, so ranks stay in step).
    refused(lambda: dist.send(torch.ones(1), dst=(r + 1) % n), "send", "point-to-point")
    refused(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "BAND",
            "integer or bool")
    refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG),
            "AVG", "floating")
    c = torch.full((3,), complex(1, r), dtype=torch.complex64)  # torch sends it as real pairs
    dist.all_reduce(c)
    same(torch.view_as_real(c), torch.view_as_real(
        torch.full((3,), complex(n, n * (n - 1) / 2), dtype=torch.complex64)), "complex SUM")
    # A rank late by more than a second: its peers' ordered collective goes to the
    # coordinator by name, the late one's follows it there, and the next ones are agreed by
    # position again.
    agreed = tutti.torch.stats()["ordered.agreed"]
    if r == n - 1:
        time.sleep(1.5)
    for k in range(3):
        t = torch.full((5,), float(r + k))
        dist.all_reduce(t)
        same(t, torch.full((5,), float(n * (n - 1) / 2 + n * k)),
             "all_reduce %d after a late rank" % k)
    assert tutti.torch.stats()["ordered.agreed"] >= agreed + 2, "no ordered op after the late one"
    dist.destroy_process_group()
    assert not tutti.torch.is_initialized()


def train(backend, steps=5, kill_at=None, hook=False, fsdp=False):
    from torch.nn.parallel import DistributedDataParallel as DDP
    init(backend)
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    if fsdp:  # FSDP2: each Linear its own group of parameters, sharded over every rank
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if kill_at is not None and step == kill_at and r == 1:
            print("rank 1: killing itself at step %d at %.3f" % (step, time.time()), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 + step * n + r)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [(p.full_tensor() if fsdp else p).detach().clone() for p in model.parameters()]
    if "tutti" in backend:  # FSDP2's gathers and reduce-scatters, DDP's buckets ran on Tutti
        ops = tutti.torch.stats()
        for op in (("allgather", "reducescatter") if fsdp else ("allreduce",)):
            calls = sum(v for k, v in ops.items() if k.startswith("op.%s." % op)
                        and k.endswith(".calls"))
            assert calls >= steps, "%d %s calls in %d steps on %s" % (calls, op, steps,
                                                                     backend)
        # c10d orders them alike on every rank: Tutti agreed on them by position, without
        # gathering requests.
        assert ops["ordered.agreed"] >= steps, "%d ops agreed by position in %d steps" % (
            ops["ordered.agreed"], steps)
    # Every rank holds the same parameters.
    for p in params:
        gathered = [torch.zeros_like(p) for _ in range(n)]
        dist.all_gather(gathered, p)
        for q in gathered:
            assert torch.equal(p, q), "ranks' parameters differ on %s" % backend
    # DDP goes while every rank still holds the process group: torch's gloo was seen to hang
    # tearing a DDP down after the other rank had left.
    del ddp, model, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return params


def compare(a, b, n, what):
    """Parameters of two runs: bit for bit at 2 ranks (each gradient element is one addition
    of two values, the same bits in either order), else within 1e-6."""
    for x, y in zip(a, b):
        if n == 2:
            assert torch.equal(x, y), "%s differ: %s" % (what, (x - y).abs().max())
        else:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    print("%s differ by at most %g" % (what, max((x - y).abs().max().item()
                                                 for x, y in zip(a, b))), flush=True)


def ddp():
    """Trains on each of --backends in turn (destroy, then re-init), comparing the runs; the
    second tutti run uses a DDP comm hook (which waits on the Work's Future). --save writes
    the first run's parameters, for a test to compare with another job's."""
    n = ARGS.size or int(os.environ.get("WORLD_SIZE", "0"))
    runs = []
    fsdp = ARGS.mode == "fsdp"
    # Commas separate the runs' backends, except inside a device-qualified one
    # ("cpu:tutti,cuda:gloo" is one run).
    backends = re.split(r",(?![a-z]+:)", ARGS.backends)
    for i, backend in enumerate(backends):
        hook = not fsdp and backend == "tutti" and "tutti" in backends[:i]
        runs.append(train(backend, hook=hook, fsdp=fsdp))
    for params in runs[1:]:
        compare(runs[0], params, n, "parameters of two runs")
    if ARGS.save and dist_rank() == 0:
        torch.save(runs[0], ARGS.save)


def on_group(group, ranks, fn):
    """Runs fn() on the members of `group` (global `ranks`) only."""
    if dist.get_rank() in ranks:
        fn()


def group_collectives(group, ranks):
    """Collectives on a group of some ranks: roots are global ranks in torch's API (the
    backend gets group ranks); results only from the members."""
    r, m = dist.get_rank(), len(ranks)
    me = ranks.index(r)
    t = values(r, 9, torch.float32)
    dist.all_reduce(t, group=group)
    same(t, reference(dist.ReduceOp.SUM, [values(i, 9, torch.float32) for i in ranks]),
         "all_reduce on %s" % ranks)
    t = values(r, 6, torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.BOR, group=group)
    same(t, reference(dist.ReduceOp.BOR, [values(i, 6, torch.int64) for i in ranks]),
         "all_reduce BOR on %s" % ranks)
    t = values(r, 5, torch.float64)
    dist.broadcast(t, src=ranks[-1], group=group)
    same(t, values(ranks[-1], 5, torch.float64), "broadcast on %s" % ranks)
    t = values(r, 4, torch.int32)
    dist.reduce(t, dst=ranks[-1], op=dist.ReduceOp.MAX, group=group)
    if r == ranks[-1]:
        same(t, reference(dist.ReduceOp.MAX, [values(i, 4, torch.int32) for i in ranks]),
             "reduce on %s" % ranks)
    whole = torch.zeros(m * 3)
    dist.all_gather_into_tensor(whole, values(r, 3, torch.float32), group=group)
    same(whole, torch.cat([values(i, 3, torch.float32) for i in ranks]),
         "all_gather_into_tensor on %s" % ranks)
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, values(r, 2 * m, torch.float32), group=group)
    same(out, sum(values(i, 2 * m, torch.float32) for i in ranks)[2 * me:2 * me + 2],
         "reduce_scatter_tensor on %s" % ranks)
    out = torch.zeros(m)
    dist.all_to_all_single(out, torch.arange(m, dtype=torch.float32) + 10 * r, group=group)
    same(out, torch.tensor([10.0 * i + me for i in ranks]), "all_to_all_single on %s" % ranks)
    got = torch.zeros(4, dtype=torch.int64)
    chunks = [values(10 + i, 4, torch.int64) for i in ranks] if r == ranks[0] else None
    dist.scatter(got, scatter_list=chunks, src=ranks[0], group=group)
    same(got, values(10 + r, 4, torch.int64), "scatter on %s" % ranks)
    objs = [None] * m
    dist.all_gather_object(objs, r, group=group)
    assert objs == ranks, objs
    dist.barrier(group=group)


def mesh_checks(shape):
    """init_device_mesh("cpu", shape): an all_reduce on every dimension's group."""
    from torch.distributed.device_mesh import init_device_mesh
    r = dist.get_rank()
    mesh = init_device_mesh("cpu", shape)
    for dim in range(len(shape)):
        group = mesh.get_group(dim)
        ranks = dist.get_process_group_ranks(group)
        assert r in ranks and len(ranks) == shape[dim], (shape, dim, ranks)
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t, group=group)
        same(t, torch.full((3,), float(sum(i + 1 for i in ranks))),
             "all_reduce on mesh %s dim %d" % (shape, dim))


def expect_monitored_failure(group, skipping, wait_all, words):
    """monitored_barrier on `group` where the ranks `skipping` do not come: rank 0 must raise
    naming them, the others that came raise too, quoting it, in gloo's words."""
    r = dist.get_rank()
    if r in skipping:
        return
    if r != 0:
        words = list(words) + ["Rank %d successfully reached monitoredBarrier" % r]
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=2),
                               wait_all_ranks=wait_all)
    except Exception as e:  # noqa: BLE001 - its message is checked
        text = str(e)
        for w in words:
            assert w in text, "expected %r in: %s" % (w, text)
        return
    raise AssertionError("monitored_barrier passed with ranks %s away" % (skipping,))


def groups():
    if ARGS.tutti_init:
        tutti.torch.init()
    init("tutti")
    r, n = dist.get_rank(), dist.get_world_size()
    assert n in (3, 4), n
    pair = dist.new_group([0, 2])  # rank 1 (and 3) only take part in making it
    rest = dist.new_group([i for i in range(n) if i != 0])
    assert len(tutti.torch.distributed._group_sets) == 2, tutti.torch.distributed._group_sets
    if r in (0, 1):  # torch has the others return at once
        refused(lambda: dist.new_group([0, 1], use_local_synchronization=True),
                "use_local_synchronization=True is not supported", "new_group(ranks=[0, 1])")
    refused(lambda: dist.new_group([0, 1] if r == 0 else [1, 2]), "ranks disagree",
            "rank 0 passes [0, 1], but its member rank 1 passes [1, 2]")
    on_group(pair, [0, 2], lambda: group_collectives(pair, [0, 2]))
    on_group(rest, list(range(1, n)), lambda: group_collectives(rest, list(range(1, n))))
    # Groups by enumeration: every rank in one of them (at 3 ranks, one of a single rank).
    halves = [[0, 1], [2, 3]] if n == 4 else [[0, 2], [1]]
    mine, _ = dist.new_subgroups_by_enumeration(halves)
    mine_ranks = [h for h in halves if r in h][0]
    group_collectives(mine, mine_ranks)
    if n == 4:
        sub, all_subs = dist.new_subgroups(group_size=2)
        assert len(all_subs) == 2
        group_collectives(sub, [r - r % 2, r - r % 2 + 1])
        # Groups of one rank split from each half: group names alike, ranks not.
        alone, _ = dist.new_subgroups(group_size=1, group=mine)
        group_collectives(alone, [r])
        mesh_checks((2, 2))
    else:
        mesh_checks((3,))
        mesh_checks((1, 3))
    made = [i for views in tutti.torch.distributed._group_sets.values()  # Tutti's sets
            for i in views.values()]
    # Destroying a group on its members; the world goes on.
    if r in (0, 2):
        dist.destroy_process_group(pair)
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(n)), "all_reduce on the world after destroying a group")
    # monitored_barrier: everyone, then ranks away.
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    on_group(rest, list(range(1, n)),
             lambda: dist.monitored_barrier(group=rest, wait_all_ranks=True))
    g1 = dist.new_group(list(range(n)))  # fresh groups: a failed barrier leaves its own
    g2 = dist.new_group(list(range(n)))
    expect_monitored_failure(g1, [n - 1], False,
                             ["Rank %d failed to pass monitoredBarrier" % (n - 1)])
    skipping = list(range(1, n))[-2:]
    expect_monitored_failure(g2, skipping, True,
                             ["Ranks %s failed to pass monitoredBarrier"
                              % ", ".join(str(i) for i in skipping)])
    # Rank 0 alone, with no time at all: its own time is up, as gloo says it.
    g3 = dist.new_group(list(range(n)))
    if r == 0:
        refused(lambda: g3.monitored_barrier(datetime.timedelta(seconds=0)),
                "Rank 0 timed out in monitoredBarrier after 0 ms",
                "No ranks successfully processed in monitoredBarrier")
    dist.barrier()
    dist.destroy_process_group()
    if ARGS.tutti_init:  # Tutti still runs: the groups' process sets are gone
        assert tutti.torch.is_initialized()
        for set_id in made:
            assert tutti.torch._C.process_set_size(set_id) == -1, set_id
        assert not tutti.torch.distributed._group_sets
        tutti.torch.shutdown()
    else:
        assert not tutti.torch.is_initialized()


def dist_rank():
    if ARGS.rank is not None:
        return ARGS.rank
    for v in ("RANK", "TUTTI_RANK", "OMPI_COMM_WORLD_RANK"):
        if v in os.environ:
            return int(os.environ[v])
    return 0


def kill():
    try:
        train("tutti", steps=10, kill_at=3)
    except Exception as e:  # noqa: BLE001
        print("failed at %.3f" % time.time(), flush=True)
        print("FAILED AS EXPECTED: %s: %s" % (type(e).__name__, e), flush=True)
        sys.exit(3)
    raise AssertionError("training went on after rank 1 died")


def mismatch():
    init("tutti")
    r = dist.get_rank()
    t = torch.ones(4)
    group = None
    store = dist.distributed_c10d._get_default_store()
    if ARGS.subgroup:
        group = dist.new_group([0, 2])
        if r == 1:  # not a member: no part in the group's failure, but alive through it
            store.wait(["failed 0", "failed 2"], datetime.timedelta(seconds=60))
            return
    try:
        if r == 0:
            dist.all_reduce(t, group=group)
        else:
            dist.broadcast(t, src=0, group=group)
    except Exception as e:  # noqa: BLE001
        print("FAILED AS EXPECTED: %s: %s" % (type(e).__name__, e), flush=True)
        store.set("failed %d" % r, "1")
        sys.exit(3)
    raise AssertionError("mismatched collectives completed")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["collectives", "ddp", "fsdp", "kill", "mismatch",
                                         "groups"])
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--size", type=int, default=None)
    parser.add_argument("--init-method", default=None)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--backends", default="tutti,gloo,tutti")
    parser.add_argument("--save", default=None)
    parser.add_argument("--subgroup", action="store_true")
    parser.add_argument("--tutti-init", action="store_true")
    parser.add_argument("--deadline", type=float, default=150,
                        help="seconds after which the process dumps its stacks and exits")
    ARGS = parser.parse_args()
    faulthandler.dump_traceback_later(ARGS.deadline, exit=True)
    {"collectives": collectives, "ddp": ddp, "kill": kill, "mismatch": mismatch,
     "groups": groups, "fsdp": ddp}[ARGS.mode]()
    print("OK %s" % ARGS.mode, flush=True)
    sys.stderr.flush()
    # Not the interpreter's teardown: torch's gloo process group, once destroyed, can hang in
    # it when rank 0's TCPStore is gone first (seen under tuttirun and mpirun, not torchrun).
    os._exit(0)


if __name__ == "__main__":
    main()
