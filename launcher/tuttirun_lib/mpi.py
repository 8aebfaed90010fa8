"""The mpirun (Open MPI) command equivalent to a tuttirun invocation, and running it."""
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

from .spawn import Job, OutputForwarder

# Open MPI's daemons notice a host that stopped answering (its link down, say) by TCP
# keepalive: by default after 300 + 9 x 20 s, 8 minutes in which mpirun waits. tuttirun asks
# for 5 + 5 x 2 s, so that a job with a lost host ends within about 15 s of the loss
# (mpirun: "ORTE has lost communication with a remote daemon ... node h2").
KEEPALIVE = [("oob_tcp_keepalive_time", "5"), ("oob_tcp_keepalive_intvl", "2"),
             ("oob_tcp_keepalive_probes", "5")]


class MpiOptions:
    """What tuttirun's flags add to mpirun's command line."""

    def __init__(self, output_dir=None, nics=None, tcp=False, binding_args=None,
                 extra_args=None, remote=False):
        self.output_dir = output_dir
        self.nics = nics or []          # --network-interface(s): pin MPI's TCP traffic
        self.tcp = tcp                  # --tcp: the TCP BTL only
        self.binding_args = binding_args  # replaces --bind-to none ("": mpirun's default)
        self.extra_args = extra_args    # --mpi-args, split like a shell
        self.remote = remote            # hosts other than this one: keepalive on


def mpirun_command(np, hosts, env, command, options=None, mpirun="mpirun", cores=None):
    """hosts: [(name, slots)] or None; env: variables to export with -x NAME=VALUE (-x NAME
    where the value is None: mpirun passes its own)."""
    options = options or MpiOptions()
    cores = cores if cores is not None else (os.cpu_count() or 1)
    extra = shlex.split(options.extra_args) if options.extra_args else []
    argv = [mpirun, "-np", str(np)]
    if hosts:
        argv += ["-H", ",".join("%s:%d" % h for h in hosts)]
    # Without -H, Open MPI offers one slot per core; with it, the listed slots.
    slots = sum(count for _, count in hosts) if hosts else cores
    if np > slots:
        argv.append("--oversubscribe")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    # None: --bind-to none; "": no binding flag at all (mpirun's own default).
    argv += ["--bind-to", "none"] if options.binding_args is None else shlex.split(options.binding_args)
    argv.append("--tag-output")
    if options.output_dir:
        argv += ["--output-filename", options.output_dir]
    params = []
    if options.nics:
        names = ",".join(options.nics)
        params += [("btl_tcp_if_include", names), ("oob_tcp_if_include", names)]
    if options.tcp:
        params += [("pml", "ob1"), ("btl", "tcp,self")]
    if options.remote:
        params += KEEPALIVE
    for name, value in params:
        if name not in extra:  # the user's --mpi-args value wins
            argv += ["--mca", name, value]
    for name in sorted(env):
        argv += ["-x", name if env[name] is None else "%s=%s" % (name, env[name])]
    return argv + extra + list(command)


# After a rank's MPI_Abort, or a rank that leaves without finalizing after a fatal error,
# mpirun ends the job within a second or two, unless it waits for the daemon of a host it
# cannot reach (the abort is retransmitted for minutes): then tuttirun stops mpirun, and the
# ssh sessions and daemons it started here with it.
ABORT_GRACE_SECONDS = 10.0
_ABORT = re.compile(rb"MPI_ABORT was invoked on rank (\d+)")
_ABORT_CODE = re.compile(rb"^with errorcode (-?\d+)")
_LEFT = re.compile(rb"tutti: rank (\d+): exiting after a fatal error .* so the process exits "
                   rb"with code (\d+) without it")


class _AbortWatch:
    """Notes Open MPI's report of an MPI_Abort, or Tutti's of a rank that leaves without
    MPI_Finalize after a fatal error, in mpirun's output (hides no line)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.at = self.rank = self.code = None
        self.how = "called MPI_Abort"

    def __call__(self, line):
        with self.lock:
            if self.at is None:
                m = _ABORT.search(line)
                if m:
                    self.at, self.rank = time.monotonic(), int(m.group(1))
                    return False
                m = _LEFT.search(line)
                if m:
                    self.at, self.rank, self.code = (time.monotonic(), int(m.group(1)),
                                                     int(m.group(2)))
                    self.how = "left after a fatal error"
            elif self.code is None:
                c = _ABORT_CODE.search(line)
                if c:
                    self.code = int(c.group(1))
        return False


def run_mpirun(argv, grace=ABORT_GRACE_SECONDS, timestamp=False):
    """Runs mpirun in a session of its own, forwarding its output (each line after the local
    time with `timestamp`); returns tuttirun's code."""
    try:
        # A terminal's Ctrl-C reaches tuttirun only, which forwards it once (mpirun given
        # SIGINT twice exits at once and may leave ranks behind). It dies with tuttirun
        # (PR_SET_PDEATHSIG).
        proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=Job.preexec(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        print("tuttirun: error: mpirun not found on PATH (Open MPI is needed for --mpi)",
              file=sys.stderr, flush=True)
        return 127
    received = []

    def forward(signum, _frame):
        received.append(signum)
        if len(received) == 1:  # once: mpirun takes a second SIGINT as "exit now"
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    watch = _AbortWatch()
    forwarder = OutputForwarder(prefix=False, timestamp=timestamp)
    forwarder.attach(0, "stdout", proc.stdout, watch)
    forwarder.attach(0, "stderr", proc.stderr, watch)
    code = None
    while code is None:
        try:
            code = proc.wait(0.2)
        except subprocess.TimeoutExpired:
            if watch.at is not None and time.monotonic() - watch.at > grace:
                print("tuttirun: mpirun has not ended %g s after rank %d %s "
                      "(a host it cannot reach?); stopping it" % (grace, watch.rank, watch.how),
                      file=sys.stderr, flush=True)
                _stop_group(proc)
                code = watch.code if watch.code and 0 < watch.code < 256 else 1
    forwarder.join(5.0)
    if received:  # mpirun exits 1 after forwarding a signal: report the signal, as --gloo
        return 128 + received[0]
    return 128 - code if code < 0 else code


def _stop_group(proc):
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
