"""Steady training-like throughput over libtutti's C API (ctypes, standard library only):
every step submits T allreduces of S bytes at once (as a backward pass does), then waits.
Used by the autotune test and benchmark (docs/PERFORMANCE.md, "Autotune").

  throughput.py STEPS [TENSORS [BYTES [UNTIL]]]     defaults 256 tensors of 4096 bytes
Environment: TUTTI_LIB (path of libtutti.so). Rank 0 prints, per quarter of the steps, the
median step time and the bytes per second, and checks every result (the sum of the ranks).
With UNTIL (a file, such as the autotune log), STEPS is a cap: the job stops after the step
in which rank 0 saw a line of that file with ",done," in it. Rank 0's vote travels in the
second float of the first tensor, so every rank stops after the same step.
"""
import ctypes
import os
import sys
import time

lib = ctypes.CDLL(os.environ["TUTTI_LIB"])
lib.tutti_last_error.restype = ctypes.c_char_p
FLOAT32, SUM = 8, 0


def check(status, what):
    if status != 0:
        sys.exit("%s failed: %s" % (what, lib.tutti_last_error().decode()))


check(lib.tutti_init(), "init")
rank, size = lib.tutti_rank(), lib.tutti_size()
steps = int(sys.argv[1])
tensors = int(sys.argv[2]) if len(sys.argv) > 2 else 256
count = (int(sys.argv[3]) if len(sys.argv) > 3 else 4096) // 4
until = sys.argv[4] if len(sys.argv) > 4 else None
if until and count < 2:
    sys.exit("UNTIL needs tensors of at least 8 bytes")


def done_in(path):
    try:
        with open(path) as f:
            return ",done," in f.read()
    except OSError:
        return False

names = [("grad.%d" % i).encode() for i in range(tensors)]
bufs = [(ctypes.c_float * count)() for _ in range(tensors)]
expected = float(sum(range(size)))
times = []
for step in range(steps):
    for b in bufs:
        ctypes.memset(b, 0, ctypes.sizeof(b))
        b[0] = float(rank)
    if until and rank == 0 and done_in(until):
        bufs[0][1] = 1.0
    start = time.perf_counter()
    handles = []
    for name, b in zip(names, bufs):
        h = ctypes.c_int64()
        check(lib.tutti_allreduce_async(name, b, b, ctypes.c_int64(count), FLOAT32, SUM,
                                        ctypes.c_double(1.0), ctypes.c_double(1.0),
                                        ctypes.byref(h)), "allreduce")
        handles.append(h)
    for h in handles:
        check(lib.tutti_wait(h, ctypes.c_double(-1)), "wait step %d" % step)
    times.append(time.perf_counter() - start)
    if any(b[0] != expected for b in bufs):
        sys.exit("rank %d step %d: wrong result" % (rank, step))
    if until and bufs[0][1] != 0:
        break
steps = len(times)
if rank == 0:
    step_bytes = tensors * count * 4
    quarter = max(steps // 4, 1)
    for q in range(0, steps, quarter):
        part = sorted(times[q:q + quarter])
        median = part[len(part) // 2]
        print("steps %d-%d: median step %.0f us, %.1f MB/s" % (
            q, q + len(part) - 1, median * 1e6, step_bytes / median / 1e6), flush=True)
check(lib.tutti_shutdown(), "shutdown")
