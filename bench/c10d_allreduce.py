#!/usr/bin/env python3
"""torch.distributed all_reduce on Tutti's backend against gloo's, in the same processes.

Every rank joins two process groups over all ranks, one of backend "gloo" (the default group)
and one of backend "tutti" (tutti.torch's c10d backend), and times `dist.all_reduce` (SUM,
float32, in place) of each size on both, taking turns (gloo, tutti, gloo, ...) so that load on
a shared machine hits both alike. Each call starts after a barrier on its own group; a
figure is the slowest rank's median over the timed calls; busbw = 2 (n-1)/n * bytes / time,
as nccl-tests counts it. The results are checked (every element must be the sum of the
ranks' values), so a wrong answer fails the run (exit status 1).

    tuttirun -np 2 python3 bench/c10d_allreduce.py
    mpirun -np 4 --oversubscribe python3 bench/c10d_allreduce.py --sizes-mib 1,16,64

The job needs nothing but the launcher: importing tutti.torch under tuttirun or mpirun sets
torch's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (docs/pytorch.md).
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import tutti.torch  # noqa: F401  (registers the "tutti" backend, sets torch's variables)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", default="1,4,16,64",
                   help="comma-separated sizes in MiB (fractions allowed; default 1,4,16,64)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per size and backend")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size and backend")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
    args = p.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes_mib.split(",") if s]
    except ValueError:
        p.error("--sizes-mib: expected comma-separated numbers, got %r" % args.sizes_mib)
    if not args.sizes or min(args.sizes) <= 0:
        p.error("--sizes-mib: expected sizes > 0, got %r" % args.sizes_mib)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return args


def timed(group, tensor):
    dist.barrier(group=group)
    start = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    return time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": None, "tutti": dist.new_group(backend="tutti")}
    expected_sum = size * (size + 1) / 2  # rank r contributes r + 1
    rows, ok = [], True
    for mib in args.sizes:
        count = max(1, int(mib * (1 << 20)) // 4)
        buffers = {name: torch.empty(count, dtype=torch.float32) for name in groups}
        samples = {name: [] for name in groups}
        for i in range(args.warmup + args.iters):
            for name, group in groups.items():  # take turns
                t = buffers[name]
                t.fill_(rank + 1)
                seconds = timed(group, t)
                if i >= args.warmup:
                    samples[name].append(seconds)
                if not (t[0].item() == expected_sum and t[-1].item() == expected_sum
                        and bool(torch.all(t == expected_sum))):
                    print("error: rank %d: %s all_reduce of %g MiB gave a wrong sum"
                          % (rank, name, mib), file=sys.stderr)
                    ok = False
        row = {"mib": mib, "bytes": count * 4, "ranks": size}
        for name in groups:
            med = torch.tensor([statistics.median(samples[name])], dtype=torch.float64)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank's median
            seconds = med.item()
            row[name + "_ms"] = seconds * 1e3
            row[name + "_busbw"] = 2.0 * (size - 1) / size * count * 4 / seconds / 1e9
        rows.append(row)
    if rank == 0:
        print("# torch.distributed all_reduce (SUM, float32, in place): tutti backend vs gloo, "
              "torch %s, %d ranks, slowest rank's median of %d calls"
              % (torch.__version__, size, args.iters))
        print("# %10s %12s %12s %12s %12s %12s" % ("MiB", "gloo ms", "gloo GB/s", "tutti ms",
                                                  "tutti GB/s", "tutti/gloo"))
        for r in rows:
            print("  %10g %12.3f %12.3f %12.3f %12.3f %12.2f" % (
                r["mib"], r["gloo_ms"], r["gloo_busbw"], r["tutti_ms"], r["tutti_busbw"],
                r["gloo_ms"] / r["tutti_ms"]))  # = the busbw ratio
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "results": rows}, f, indent=1)
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
