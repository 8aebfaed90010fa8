"""How tutti.torch jobs end (docs/architecture.md, "Exits and failures"): each case launches
a small script under mpirun, tuttirun --mpi and tuttirun --gloo and checks the launcher's exit
code, the wall time and that no process of the job is left (a marker in the job's
environment, searched in /proc).

These launch jobs of their own, so they run only from their own CTest entry
(python_torch_exit, TUTTI_EXIT_TESTS=1), never inside the rank-per-process suites."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_EXIT_TESTS") != "1",
                                reason="launches jobs: run by the python_torch_exit test")

TUTTIRUN = os.environ.get("TUTTIRUN", "")
MPIRUN = os.environ.get("MPIRUN", "")
TIMEOUT = 5.0
LAUNCHERS = ["gloo"] + (["mpirun", "tuttirun-mpi"] if MPIRUN else [])


def job_processes(marker):
    needle = ("TUTTI_EXIT_TEST_JOB=%s" % marker).encode()
    found = []
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


def launch(launcher, np, script, limit=60):
    """Runs `script` (Python source) on np ranks; returns (rc, wall, output, left)."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, TUTTI_TIMEOUT_SECONDS=str(TIMEOUT), TUTTI_EXIT_TEST_JOB=marker,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    env.pop("TUTTI_EXIT_TESTS", None)
    program = [sys.executable, "-c", script]
    if launcher == "mpirun":
        argv = [MPIRUN, "-np", str(np), "--oversubscribe", "--bind-to", "none",
                "--mca", "btl", "self,vader"] + program
    else:
        argv = [sys.executable, TUTTIRUN, "-np", str(np),
                "--mpi" if launcher == "tuttirun-mpi" else "--gloo"] + program
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output = proc.communicate(timeout=limit)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0].decode(errors="replace") + "\n(HUNG)"
    wall = time.monotonic() - start
    left = job_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return proc.returncode, wall, output, left


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_quick_start_without_shutdown(launcher):
    """Defect 1: the docs/pytorch.md quick start, verbatim: init, print, end of script."""
    rc, wall, out, left = launch(launcher, 2,
                                 "import tutti.torch as hvd; hvd.init(); print(hvd.rank())")
    what = "%s: rc %s after %.1f s, left %s\n%s" % (launcher, rc, wall, left, out)
    assert left == [], what
    assert rc == 0, what
    assert "FINALIZE" not in out, what
    assert wall < 30, what


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_exit_code_and_uncaught_exception(launcher):
    """Defects 2 and 3: rank 1 leaves with sys.exit(7) mid-job; rank 0, whose next op
    fails, raises (uncaught). The launcher exits 7 (mpirun: Open MPI picks a failing
    rank's code), quickly, with nothing left."""
    script = (
        "import sys, torch, tutti.torch as hvd\n"
        "hvd.init()\n"
        "t = torch.ones(4)\n"
        "for step in range(200):\n"
        "    if step == 5 and hvd.rank() == 1:\n"
        "        sys.exit(7)\n"
        "    hvd.allreduce(t, name='step.%d' % step)\n")
    rc, wall, out, left = launch(launcher, 2, script)
    what = "%s: rc %s after %.1f s, left %s\n%s" % (launcher, rc, wall, left, out)
    assert left == [], what
    assert rc == (7 if launcher != "mpirun" else rc) and rc != 0, what
    assert "rank 1 called shutdown" in out, what
    assert wall < TIMEOUT + 10 + 10, what  # + interpreter starts on 2 shared cores
