"""Starting workers (locally or over ssh), forwarding their output, and tearing them down.

Each local worker runs in its own session (process group), so stopping the job means
signalling whole groups: SIGTERM, then SIGKILL after a grace period. A remote worker runs
under `ssh host sh -c SCRIPT`: the script reads the job secret from ssh's stdin (never from
its command line), starts the command with setsid and kills that group when ssh's stdin
closes, which tuttirun does (and which happens when tuttirun dies) to stop it.
"""
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

SECRET_ENV = "TUTTI_SECRET"
# The remote script's first word on stderr: the worker's pid there (kept from the output).
REMOTE_PID_MARK = b"TUTTIRUN_REMOTE_PID "


def _load_prctl():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Each local worker in a process group of its own (tuttirun signals the group), in tuttirun's
# session. Not a session of its own: under the kernel's autogroup scheduling every session
# is a scheduling group, and a rank whose threads wait with sched_yield() would then yield
# only to its own threads, spinning while the ranks it waits for need the CPU (measured:
# 17x the yields and a 1.5x slower training step at 4 ranks on 2 cores, against mpirun,
# whose ranks share one session). process_group needs Python 3.11; before, a session.
_OWN_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11)
              else {"start_new_session": True})

_PRCTL = _load_prctl()


def _die_with_parent():
    """In the child before exec: SIGKILL it if tuttirun dies (even by SIGKILL). Safe only
    while tuttirun has no other threads, so Job starts every process before any thread."""
    _PRCTL(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class OutputForwarder:
    """Forwards whole lines from workers' pipes, prefixed "[rank]<stdout>:", under one lock
    so lines never interleave; optionally also writes DIR/rank.N/{stdout,stderr}. With
    `timestamp` (--prefix-output-with-timestamp) each forwarded line starts with the local
    time as horovodrun writes it: "Wed Dec  2 01:40:00 2026[0]<stdout>:..."."""

    def __init__(self, output_dir=None, prefix=True, timestamp=False):
        self.lock = threading.Lock()
        self.output_dir = output_dir
        self.prefix = prefix
        self.timestamp = timestamp
        self.threads = []

    def attach(self, rank, name, pipe, watch=None):
        """watch(line): sees every line first; a line it returns True for is not forwarded."""
        sink = None
        if self.output_dir:
            directory = os.path.join(self.output_dir, "rank.%d" % rank)
            os.makedirs(directory, exist_ok=True)
            sink = open(os.path.join(directory, name), "wb")
        target = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        tag = ("[%d]<%s>:" % (rank, name)).encode()
        t = threading.Thread(target=self._pump, args=(pipe, target, tag, sink, watch),
                             daemon=True)
        t.start()
        self.threads.append(t)

    def _pump(self, pipe, target, tag, sink, watch):
        try:
            for line in iter(pipe.readline, b""):
                if watch and watch(line):
                    continue
                if not line.endswith(b"\n"):
                    line += b"\n"
                head = tag if self.prefix else b""
                if self.timestamp:
                    head = time.asctime().encode() + head
                with self.lock:
                    target.write(head + line)
                    target.flush()
                if sink:
                    sink.write(line)
                    sink.flush()
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()
            if sink:
                sink.close()

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def remote_command(host, command, env, cwd, secret, ssh_port=None, ssh_identity=None,
                   connect_timeout=None):
    """argv for running `command` on `host` over ssh, and the bytes to write to its stdin.
    `env` must not contain the secret: it travels on stdin."""
    assert SECRET_ENV not in env
    assignments = " ".join(shlex.quote("%s=%s" % kv) for kv in sorted(env.items()))
    # sh runs background jobs with stdin from /dev/null, so the watchdog reads a copy of
    # ssh's stdin (fd 3) and kills the worker's session when it closes.
    script = (
        "IFS= read -r %s || exit 126; export %s; "
        "cd %s || exit 126; "
        "exec 3<&0; "
        "setsid env %s %s </dev/null 3<&- & pid=$!; "
        "echo %s$pid >&2; "
        "( while IFS= read -r _ <&3; do :; done; kill -s TERM -- -$pid; sleep 3; "
        "kill -s KILL -- -$pid ) >/dev/null 2>&1 & watchdog=$!; "
        "exec 3<&-; "
        "wait $pid; rc=$?; kill $watchdog 2>/dev/null; exit $rc"
        % (SECRET_ENV, SECRET_ENV, shlex.quote(cwd), assignments,
           " ".join(shlex.quote(a) for a in command), REMOTE_PID_MARK.decode()))
    # ServerAlive*: ssh ends (code 255) when the host stops answering for 15 s, so a lost
    # host ends the job even where no rank would notice before TUTTI_TIMEOUT_SECONDS.
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if connect_timeout:
        argv += ["-o", "ConnectTimeout=%d" % max(1, int(connect_timeout))]
    if ssh_port:
        argv += ["-p", str(ssh_port)]
    if ssh_identity:
        argv += ["-i", ssh_identity]
    argv += [host, "sh -c %s" % shlex.quote(script)]
    return argv, (secret + "\n").encode()


class Worker:
    def __init__(self, slot, popen, where):
        self.slot, self.popen, self.where = slot, popen, where
        self.returncode = None
        self.remote_pid = None  # a remote worker's pid on its host, once its script said

    def watch_stderr(self, line):
        """Takes the remote script's report of the worker's pid out of its stderr."""
        if self.remote_pid is None and line.startswith(REMOTE_PID_MARK):
            value = line[len(REMOTE_PID_MARK):].strip()
            if value.isdigit():
                self.remote_pid = int(value)
                return True
        return False

    @property
    def rank(self):
        return self.slot.rank

    def describe_exit(self):
        code = self.returncode
        if self.popen.stdin:
            # Remote: ssh returns the remote sh's `wait` status, 128 + n for a worker killed
            # by signal n, and 255 for its own failure (no connection, or a lost one).
            if self.remote_pid is not None:
                who = "rank %d (pid %d on %s)" % (self.rank, self.remote_pid, self.where)
            else:  # the worker never started there: name the ssh process here
                who = "rank %d (on %s, ssh pid %d here)" % (self.rank, self.where,
                                                          self.popen.pid)
            if code == 255:
                return "%s: ssh exited with code 255 (the connection to %s failed or was " \
                       "lost)" % (who, self.where)
            if code > 128 and code - 128 < signal.NSIG:
                code = 128 - code
        else:
            who = "rank %d (pid %d on %s)" % (self.rank, self.popen.pid, self.where)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "signal"
            return "%s killed by signal %d (%s)" % (who, -code, name)
        return "%s exited with code %d" % (who, code)

    def exit_status(self):
        code = self.returncode
        return 128 - code if code < 0 else code

    def signal(self, sig):
        if self.popen.stdin:  # remote: closing ssh's stdin stops the remote group
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """Starts all workers, waits, and stops everyone on the first failure or a signal."""

    def __init__(self, forwarder, grace_seconds=3.0, log=None):
        self.forwarder = forwarder
        self.grace = grace_seconds
        self.workers = []
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.interrupted = None

    def start_local(self, slot, command, env, cpus=None):
        """cpus: the CPUs the worker is bound to (--bind-to), or None."""
        preexec = self.preexec(cpus)
        popen = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 preexec_fn=preexec, **_OWN_GROUP)
        if cpus and preexec is None:  # not safe before exec here: bind it right after
            try:
                os.sched_setaffinity(popen.pid, cpus)
            except OSError:
                pass
        self._add(slot, popen, slot.host)

    def start_remote(self, slot, argv, stdin_bytes):
        popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=self.preexec())
        popen.stdin.write(stdin_bytes)
        popen.stdin.flush()  # stdin stays open: closing it stops the remote worker
        self._add(slot, popen, slot.host)

    @staticmethod
    def preexec(cpus=None):
        if threading.active_count() != 1:
            return None
        if not cpus:
            return _die_with_parent if _PRCTL else None

        def bind_and_die_with_parent():
            os.sched_setaffinity(0, cpus)
            if _PRCTL:
                _die_with_parent()
        return bind_and_die_with_parent

    def _add(self, slot, popen, where):
        self.workers.append(Worker(slot, popen, where))

    def forward_output(self):
        """Starts the forwarding threads, once every process is started (pipes buffer the
        little output written meanwhile)."""
        for w in self.workers:
            self.forwarder.attach(w.rank, "stdout", w.popen.stdout)
            remote = w.popen.stdin is not None
            self.forwarder.attach(w.rank, "stderr", w.popen.stderr,
                                  w.watch_stderr if remote else None)

    def on_signal(self, signum, _frame):
        self.interrupted = signum

    def wait(self):
        """Returns tuttirun's exit code."""
        if not self.forwarder.threads:
            self.forward_output()
        failed = None
        running = list(self.workers)
        while running and failed is None and self.interrupted is None:
            for w in list(running):
                code = w.popen.poll()
                if code is None:
                    continue
                w.returncode = code
                running.remove(w)
                if code != 0 and failed is None:
                    failed = w
            if running and failed is None:
                time.sleep(0.02)
        if self.interrupted is not None:
            self.log("tuttirun: received %s, stopping %d worker(s)" % (
                signal.Signals(self.interrupted).name, len(running)))
        elif failed is not None:
            self.log("tuttirun: %s; stopping the other %d worker(s)" % (failed.describe_exit(),
                                                                       len(running)))
        self.stop()
        self.forwarder.join(5.0)
        if self.interrupted is not None:
            return 128 + self.interrupted
        return failed.exit_status() if failed else 0

    def stop(self):
        """SIGTERM every worker's group, SIGKILL what is left after the grace period."""
        for w in self.workers:
            w.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for w in self.workers:
            try:
                w.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for w in self.workers:
            w.signal(signal.SIGKILL)  # also reaps grandchildren left in the group
            try:
                w.popen.wait(5.0)
            except subprocess.TimeoutExpired:
                self.log("tuttirun: rank %d (pid %d) did not die after SIGKILL" % (
                    w.rank, w.popen.pid))
