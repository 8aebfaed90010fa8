"""A small training-like job over libtutti's C API (ctypes, standard library only), for the
observability tests. Every step submits three named allreduces at once (fused) and a
broadcast, then waits for them.

  job.py STEPS [VICTIM KILL_STEP]   VICTIM SIGKILLs itself at KILL_STEP
Environment: TUTTI_LIB (path of libtutti.so). Prints "rank R stats NAME=VALUE ..." at the
end, from tutti_stats.
"""
import ctypes
import os
import signal
import sys

lib = ctypes.CDLL(os.environ["TUTTI_LIB"])
FLOAT32, SUM = 8, 0


class Stat(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


def check(status, what):
    if status != 0:
        lib.tutti_last_error.restype = ctypes.c_char_p
        sys.exit("rank %d: %s failed: %s" % (rank, what, lib.tutti_last_error().decode()))


rank = -1
check(lib.tutti_init(), "init")
rank, size = lib.tutti_rank(), lib.tutti_size()
steps = int(sys.argv[1])
victim, kill_step = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (-1, -1)
sizes = {b"grad.a": 1000, b"grad.b": 3000, b"grad.c": 200}
bufs = {n: (ctypes.c_float * c)(*([1.0] * c)) for n, c in sizes.items()}
bcast = (ctypes.c_float * 16)()
for step in range(steps):
    if rank == victim and step == kill_step:
        os.kill(os.getpid(), signal.SIGKILL)
    handles = []
    for name, count in sizes.items():
        h = ctypes.c_int64()
        check(lib.tutti_allreduce_async(name, bufs[name], bufs[name], ctypes.c_int64(count),
                                        FLOAT32, SUM, ctypes.c_double(1.0),
                                        ctypes.c_double(1.0 / size), ctypes.byref(h)),
              "allreduce")
        handles.append(h)
    h = ctypes.c_int64()
    check(lib.tutti_broadcast_async(b"weights", bcast, ctypes.c_int64(16), FLOAT32, 0,
                                    ctypes.byref(h)), "broadcast")
    handles.append(h)
    for h in handles:
        check(lib.tutti_wait(h, ctypes.c_double(-1)), "wait step %d" % step)
stats, count = ctypes.POINTER(Stat)(), ctypes.c_int()
check(lib.tutti_stats(ctypes.byref(stats), ctypes.byref(count)), "stats")
one = ctypes.c_int64(-1)  # one counter by name agrees with the list; an unknown name fails
check(lib.tutti_stat(b"cache.misses", ctypes.byref(one)), "stat")
assert one.value == next(stats[i].value for i in range(count.value)
                         if stats[i].name == b"cache.misses"), one.value
assert lib.tutti_stat(b"no.such.counter", ctypes.byref(one)) == 1  # TUTTI_ERR_INVALID_ARGUMENT
lib.tutti_last_error.restype = ctypes.c_char_p
assert b"no counter named 'no.such.counter'" in lib.tutti_last_error()
print("rank %d stats %s" % (rank, " ".join("%s=%d" % (stats[i].name.decode(), stats[i].value)
                                          for i in range(count.value))), flush=True)
check(lib.tutti_shutdown(), "shutdown")
