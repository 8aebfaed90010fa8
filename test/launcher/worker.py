"""A worker for the launcher tests, started by tuttirun. Modes:
  env                  print one JSON line: the TUTTI_*, HOROVOD_* and X_* variables, and whether
                       the secret appears on this process's or its parent's command line
  fail RANK CODE       RANK exits with CODE after the others print their pids; others sleep
  kill RANK            RANK kills itself with SIGKILL; others sleep
  sleep [ignore-term]  print "pid P child C" (C: a grandchild in the same group), sleep 120
  spam N               print N long lines to stdout and stderr, the last without a newline
"""
import json
import os
import signal
import subprocess
import sys
import time

rank = int(os.environ.get("TUTTI_RANK", "-1"))
mode = sys.argv[1]


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def announce_and_sleep(ignore_term=False):
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "120"])
    print("pid %d child %d" % (os.getpid(), child.pid), flush=True)
    time.sleep(120)


if mode == "env":
    secret = os.environ.get("TUTTI_SECRET", "")
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("TUTTI_", "X_", "HOROVOD_"))}
    env["secret_on_cmdline"] = bool(secret) and (secret in cmdline(os.getpid()) or
                                                 secret in cmdline(os.getppid()))
    print(json.dumps(env, sort_keys=True), flush=True)
elif mode == "fail":
    if rank == int(sys.argv[2]):
        print("failing pid %d" % os.getpid(), flush=True)
        time.sleep(1.0)
        sys.exit(int(sys.argv[3]))
    announce_and_sleep()
elif mode == "kill":
    if rank == int(sys.argv[2]):
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    announce_and_sleep()
elif mode == "sleep":
    announce_and_sleep(len(sys.argv) > 2 and sys.argv[2] == "ignore-term")
elif mode == "spam":
    n = int(sys.argv[2])
    for i in range(n):
        line = "line-%d-%d-%s" % (rank, i, "x" * (200 + (i * 37) % 3000))
        sys.stdout.write(line + "\n")
        if i % 10 == 0:
            sys.stderr.write("err-%d-%d\n" % (rank, i))
    sys.stdout.write("last-%d-without-newline" % rank)
    sys.stdout.flush()
else:
    sys.exit("unknown mode " + mode)
