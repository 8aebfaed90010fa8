#!/usr/bin/env python3
"""Training throughput of tutti.torch against torch's DistributedDataParallel, side by side.

The twin of Horovod's pytorch_synthetic_benchmark.py: every rank trains a model defined in
this file on synthetic data (nothing is downloaded) and the script reports samples per second
per rank and in total, for Tutti's DistributedOptimizer and, in the same processes, on the
same model, data and initial weights, for DistributedDataParallel over torch's gloo and for
DistributedDataParallel over Tutti's torch.distributed backend (`ddp-tutti`: the same DDP on a
process group of backend "tutti"). They take turns (Tutti, DDP, DDP on tutti, ...) so that
load on a shared machine hits all alike; the figures are medians over the timed iterations.

    tuttirun -np 2 python3 bench/torch_throughput.py
    mpirun -np 4 --oversubscribe python3 bench/torch_throughput.py --model mlp --json out.json

Models: `resnet`, a ResNet-like CNN (basic residual blocks, batch norm) on 3x32x32 images;
`mlp`, many small fully connected layers (many small gradients: what fusion is for);
`transformer`, a 6-layer transformer encoder, d=256 (76 tensors, 4.8M parameters);
`wide`, four 2048x2048 linear layers (8 tensors, 64 MiB of float32 gradients: bandwidth-bound).
The framework `local` trains the same model with no communication at all (plain SGD on each
rank's own batch): its step time is the compute, and each framework's step time minus it is
that framework's communication overhead (the `comm ms` column).
DDP's process group is set up by the script (rank 0 picks a free port and tells the others
through Tutti), so the job needs nothing but the launcher. The exit status is non-zero if
the ranks' parameters differ at the end of a run, for either framework.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import tutti.torch as hvd

FRAMEWORKS = ("tutti", "ddp", "ddp-tutti", "local")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["resnet", "mlp", "transformer", "wide", "all"],
                   default="all", help="all: resnet, mlp, transformer (wide only by name)")
    p.add_argument("--frameworks", default="tutti,ddp,ddp-tutti,local",
                   help="comma-separated, from: tutti (tutti.torch's DistributedOptimizer), "
                        "ddp (DDP over gloo), ddp-tutti (DDP over the tutti backend), local "
                        "(no communication: the compute alone); default all four, taking "
                        "turns")
    p.add_argument("--batch-size", type=int, default=0,
                   help="per rank (default: 32 for resnet, 64 for mlp, 16 for transformer)")
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--mlp-layers", type=int, default=48)
    p.add_argument("--mlp-width", type=int, default=256)
    p.add_argument("--ddp-bucket-view", action="store_true",
                   help="DDP with gradient_as_bucket_view=True (both DDP frameworks): the "
                        "gradients are views into DDP's buckets, not copied in and out")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank (default 1: one rank per core)")
    p.add_argument("--split", action="store_true",
                   help="also time forward+backward and optimizer.step() apart, and the CPU "
                        "time per step of the process's threads other than the training "
                        "thread (communication threads: Tutti's background thread, gloo's); "
                        "a second table (Linux: /proc/self/task/*/schedstat)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
    args = p.parse_args(argv)
    args.frameworks = [f for f in args.frameworks.split(",") if f]
    for f in args.frameworks:
        if f not in FRAMEWORKS:
            p.error("--frameworks: unknown framework %r (expected one of %s)"
                    % (f, ", ".join(FRAMEWORKS)))
    return args


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNetLike(nn.Module):
    """ResNet-18's shape (four stages of two basic blocks) at a quarter of its width."""

    def __init__(self, classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for stage, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            for i in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if (i == 0 and stage > 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class DeepMLP(nn.Module):
    def __init__(self, layers, width, classes=10):
        super().__init__()
        self.inp = nn.Linear(128, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        x = F.relu(self.inp(x))
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)


class Transformer(nn.Module):
    """A 6-layer transformer encoder, d=256, 4 heads, feed-forward 1024 (~80 tensors, 4.8M
    parameters) over sequences of 32 vectors of 64 features, mean-pooled into 10 classes."""

    def __init__(self, layers=6, d=256, classes=10):
        super().__init__()
        self.inp = nn.Linear(64, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        return self.out(self.encoder(self.inp(x)).mean(1))


def make_model(name, args):
    torch.manual_seed(1234)  # the same initial weights on every rank and for each framework
    if name == "resnet":
        return ResNetLike()
    if name == "transformer":
        return Transformer()
    if name == "wide":
        return nn.Sequential(nn.Linear(128, 2048, bias=False), nn.ReLU(),
                             *[m for _ in range(3) for m in (nn.Linear(2048, 2048), nn.ReLU())],
                             nn.Linear(2048, 10))
    return DeepMLP(args.mlp_layers, args.mlp_width)


def make_batch(name, batch, rank):
    g = torch.Generator().manual_seed(100 + rank)
    shape = {"resnet": (batch, 3, 32, 32), "transformer": (batch, 32, 64)}.get(name,
                                                                             (batch, 128))
    return torch.randn(*shape, generator=g), torch.randint(0, 10, (batch,), generator=g)


def setup_ddp(frameworks):
    """One gloo process group for the whole run (rank 0's address and a free port via Tutti),
    and a process group of backend "tutti" over every rank for ddp-tutti; returns the
    process group of each DDP framework."""
    if hvd.rank() == 0:
        with socket.socket() as s:  # a free port; torch's store binds it right after
            s.bind(("", 0))
            port = s.getsockname()[1]
        addr = "127.0.0.1" if hvd.local_size() == hvd.size() else socket.gethostname()
        endpoint = (addr, port)
    else:
        endpoint = None
    addr, port = hvd.broadcast_object(endpoint, 0, name="bench.ddp_endpoint")
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (addr, port),
                            rank=hvd.rank(), world_size=hvd.size())
    groups = {"ddp": None}  # None: the default (gloo) group
    if "ddp-tutti" in frameworks:
        groups["ddp-tutti"] = dist.new_group(backend="tutti")
    return groups


class Trainer:
    """One framework's model, optimizer and step."""

    def __init__(self, framework, model_name, args, groups):
        self.framework = framework
        model = make_model(model_name, args)
        lr = 0.01 * hvd.size()
        if framework == "tutti":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self.model = model
        elif framework == "local":
            self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            self.model = model
        else:
            self.model = nn.parallel.DistributedDataParallel(
                model, process_group=groups[framework],
                gradient_as_bucket_view=args.ddp_bucket_view)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.params = list(model.parameters())
        self.tensors = len(self.params)
        self.numel = sum(p.numel() for p in self.params)

    def step(self, data, target, split=None):
        t0 = time.perf_counter() if split is not None else 0.0
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(data), target)
        loss.backward()
        if split is not None:
            t1 = time.perf_counter()
            split[0] += t1 - t0
        self.opt.step()
        if split is not None:
            split[1] += time.perf_counter() - t1

    def timed_iter(self, data, target, batches, split=None):
        start = time.perf_counter()
        for _ in range(batches):
            self.step(data, target, split)
        return time.perf_counter() - start

    def identical_across_ranks(self):
        flat = torch.cat([p.detach().reshape(-1) for p in self.params]).unsqueeze(0)
        gathered = hvd.allgather(flat, name="bench.check.%s" % self.framework)
        return bool(torch.equal(gathered.min(0).values, gathered.max(0).values))


def other_threads_cpu_seconds():
    """CPU time so far of this process's threads but the calling one (schedstat: ns)."""
    me = str(threading.get_native_id())
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid == me:
            continue
        try:
            with open("/proc/self/task/%s/schedstat" % tid) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9


def run_model(model_name, args, groups):
    batch = args.batch_size or {"resnet": 32, "transformer": 16, "wide": 16}.get(model_name, 64)
    data, target = make_batch(model_name, batch, hvd.rank())
    trainers = [Trainer(f, model_name, args, groups) for f in args.frameworks]
    for t in trainers:
        for _ in range(args.num_warmup_batches):
            t.step(data, target)
    rates = {t.framework: [] for t in trainers}
    steps = {t.framework: [] for t in trainers}
    splits = {t.framework: [] for t in trainers}  # per iteration: fwd+bwd, step(), other CPU
    n = args.num_batches_per_iter
    for _ in range(args.num_iters):
        for t in trainers:  # alternate, so that load changes hit every framework alike
            # Every framework starts with the ranks together: `local` lets them drift apart
            # (no communication), and the first step of the framework after it would
            # otherwise wait out that drift.
            hvd.barrier()
            split = [0.0, 0.0] if args.split else None
            cpu = other_threads_cpu_seconds() if args.split else 0.0
            seconds = t.timed_iter(data, target, n, split)
            if args.split:
                splits[t.framework].append((split[0] / n, split[1] / n,
                                            (other_threads_cpu_seconds() - cpu) / n))
            rates[t.framework].append(batch * n / seconds)
            steps[t.framework].append(seconds / n)
    results = []
    for t in trainers:
        per_rank = statistics.median(rates[t.framework])
        all_ranks = hvd.allgather_object(per_rank, name="bench.rates.%s.%s" %
                                         (model_name, t.framework))
        step_ms = hvd.allgather_object(statistics.median(steps[t.framework]) * 1e3,
                                       name="bench.steps.%s.%s" % (model_name, t.framework))
        extra = {}
        if args.split:  # each column's median over the iterations, the largest over ranks
            mine = [statistics.median(x[i] for x in splits[t.framework]) * 1e3 for i in range(3)]
            every = hvd.allgather_object(mine, name="bench.split.%s.%s" % (model_name,
                                                                          t.framework))
            extra = {k: max(r[i] for r in every)
                     for i, k in enumerate(("fwd_bwd_ms", "opt_step_ms", "other_cpu_ms"))}
        results.append(dict(extra, **{
            "model": model_name, "framework": t.framework, "ranks": hvd.size(),
            "step_ms": max(step_ms),  # the slowest rank's median step sets the pace
            "batch_per_rank": batch, "parameters": t.numel, "tensors": t.tensors,
            "samples_per_sec_per_rank": all_ranks,
            "samples_per_sec_total": sum(all_ranks),
            "iters": args.num_iters, "batches_per_iter": args.num_batches_per_iter,
            # local trains each rank on its own data: its parameters differ by design
            "identical": t.framework == "local" or t.identical_across_ranks(),
        }))
    return results


def print_table(results):
    # vs ddp: throughput over DDP's (> 1: faster); step/ddp: step time over DDP's (< 1:
    # faster); comm ms: step time minus the compute-only (local) step; comm/ddp: over DDP's.
    print("# %-11s %-9s %5s %6s %9s %8s %16s %14s %7s %9s %8s %8s %8s" % (
        "model", "frame", "ranks", "batch", "params", "tensors", "samples/s/rank",
        "samples/s", "vs ddp", "step ms", "step/ddp", "comm ms", "comm/ddp"))
    by = {(r["model"], r["framework"]): r for r in results}
    for r in results:
        ddp, local = by.get((r["model"], "ddp")), by.get((r["model"], "local"))
        ratio = "%.3f" % (r["samples_per_sec_total"] / ddp["samples_per_sec_total"]) if ddp else "-"
        step_ratio = "%.3f" % (r["step_ms"] / ddp["step_ms"]) if ddp else "-"
        comm = comm_ratio = "-"
        if local and r["framework"] != "local":
            comm_ms = r["step_ms"] - local["step_ms"]
            r["comm_ms"] = comm_ms
            comm = "%.2f" % comm_ms
            if ddp:
                ddp_comm = ddp["step_ms"] - local["step_ms"]
                comm_ratio = "%.3f" % (comm_ms / ddp_comm) if ddp_comm > 0 else "-"
        print("  %-11s %-9s %5d %6d %9d %8d %16.1f %14.1f %7s %9.2f %8s %8s %8s" % (
            r["model"], r["framework"], r["ranks"], r["batch_per_rank"], r["parameters"],
            r["tensors"], statistics.median(r["samples_per_sec_per_rank"]),
            r["samples_per_sec_total"], ratio, r["step_ms"], step_ratio, comm, comm_ratio))


def print_split(results):
    # Where a step's time goes: forward+backward (DDP's allreduces finish inside it), the
    # optimizer's step() (tutti.torch's wait for its allreduces is in it), and the CPU time
    # per step of the threads other than the training thread (on a rank with one core, time
    # taken from the training step).
    print("# %-11s %-9s %12s %12s %16s" % ("model", "frame", "fwd+bwd ms", "step() ms",
                                           "other cpu ms"))
    for r in results:
        if "fwd_bwd_ms" in r:
            print("  %-11s %-9s %12.2f %12.2f %16.2f" % (r["model"], r["framework"],
                                                        r["fwd_bwd_ms"], r["opt_step_ms"],
                                                        r["other_cpu_ms"]))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hvd.init()
    ddp = [f for f in args.frameworks if f.startswith("ddp")]
    groups = setup_ddp(ddp) if ddp else {}
    models = ["resnet", "mlp", "transformer"] if args.model == "all" else [args.model]
    results = []
    for name in models:
        results.extend(run_model(name, args, groups))
    ok = all(r["identical"] for r in results)
    if hvd.rank() == 0:
        print("# tutti.torch and DDP on tutti vs DistributedDataParallel (gloo), torch %s, %d ranks, "
              "medians of %d iterations of %d batches%s" % (
                  torch.__version__, hvd.size(), args.num_iters, args.num_batches_per_iter,
                  ", DDP with gradient_as_bucket_view" if args.ddp_bucket_view else ""))
        print_table(results)
        if args.split:
            print_split(results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "results": results}, f, indent=1)
        for r in results:
            if not r["identical"]:
                print("error: %s/%s: parameters differ across ranks after training" %
                      (r["model"], r["framework"]), file=sys.stderr)
    if ddp:
        dist.destroy_process_group()
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
