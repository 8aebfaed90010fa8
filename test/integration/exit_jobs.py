"""Launching a whole job for the exit tests (exit_test.py here, test/python/test_torch_exit.py):
under mpirun, tuttirun --mpi or tuttirun --gloo, with a deadline, timed, and with the
processes it left behind found and killed. Every job carries a unique marker in its
environment, searched in /proc once the launcher has returned. Standard library only.

Environment: TUTTIRUN (tuttirun of the build tree), MPIRUN (empty: no MPI launchers),
EXIT_LAUNCHERS (comma-separated subset of gloo, mpirun, tuttirun-mpi; default all that can
run: CTest runs each launcher as a test of its own, side by side)."""
import os
import signal
import subprocess
import sys
import time
import uuid

TUTTIRUN = os.environ.get("TUTTIRUN", "")
MPIRUN = os.environ.get("MPIRUN", "")
TIMEOUT = 5.0  # TUTTI_TIMEOUT_SECONDS of every job
LAUNCHERS = ["gloo"] + (["mpirun", "tuttirun-mpi"] if MPIRUN else [])
if os.environ.get("EXIT_LAUNCHERS"):
    LAUNCHERS = [l for l in os.environ["EXIT_LAUNCHERS"].split(",") if l in LAUNCHERS]


def job_processes(marker):
    """PIDs of live (not zombie) processes whose environment holds `marker`."""
    found = []
    needle = ("TUTTI_EXIT_TEST_JOB=%s" % marker).encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/stat" % entry) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def command(launcher, np, program, tuttirun_args=()):
    if launcher == "mpirun":
        return [MPIRUN, "-np", str(np), "--oversubscribe", "--bind-to", "none",
                "--mca", "btl", "self,vader"] + program
    how = "--mpi" if launcher == "tuttirun-mpi" else "--gloo"
    return [sys.executable, TUTTIRUN, "-np", str(np), how] + list(tuttirun_args) + program


class Job:
    """Runs `program` (argv) on np ranks: rc, wall seconds, output, processes left (killed).
    `env` is added to (None: removed from) the job's environment; `tuttirun_args` go to
    tuttirun only."""

    def __init__(self, launcher, np, program, limit=TIMEOUT + 40, interrupt_after=None,
                 env=None, tuttirun_args=()):
        marker, extra = uuid.uuid4().hex, env
        env = dict(os.environ, TUTTI_TIMEOUT_SECONDS=str(TIMEOUT),
                   TUTTI_EXIT_TEST_JOB=marker, OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        env.pop("TUTTI_EXIT_TESTS", None)
        for name, value in (extra or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        start = time.monotonic()
        proc = subprocess.Popen(command(launcher, np, program, tuttirun_args), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            if interrupt_after is not None:
                try:
                    proc.wait(interrupt_after)
                except subprocess.TimeoutExpired:  # like a terminal: the whole group
                    os.killpg(proc.pid, signal.SIGINT)
            self.output = proc.communicate(timeout=limit)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            self.output = proc.communicate()[0].decode(errors="replace") + "\n(HUNG)"
        self.wall = time.monotonic() - start
        self.rc = proc.returncode
        self.left = job_processes(marker)
        for pid in self.left:  # clean up what a failing case left, then report it
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.what = "%s %s: rc %s after %.1f s, left %s\n%s" % (
            launcher, " ".join(program[-4:]), self.rc, self.wall, self.left,
            self.output[-3000:])
