"""How tutti.torch jobs end (docs/architecture.md, "Exits and failures"): each case launches
a small script under mpirun, tuttirun --mpi and tuttirun --gloo and checks the launcher's exit
code, the wall time and that no process of the job is left (test/integration/exit_jobs.py).

These launch jobs of their own, so they run only from their own CTest entry
(python_torch_exit, TUTTI_EXIT_TESTS=1), never inside the rank-per-process suites."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
from exit_jobs import LAUNCHERS, TIMEOUT, Job  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_EXIT_TESTS") != "1",
                                reason="launches jobs: run by the python_torch_exit test")


def launch(launcher, np, script):
    job = Job(launcher, np, [sys.executable, "-c", script], limit=60)
    return job.rc, job.wall, job.output, job.left


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
@pytest.mark.parametrize("leave,code", [("sys.exit(7)", 7), ("raise ValueError('bad batch')", 1)])
def test_exit_code_and_uncaught_exception(launcher, leave, code):
    """Defects 2 and 3: rank 1 leaves mid-job (sys.exit(7), or an uncaught exception);
    rank 0, whose next op fails, raises (uncaught) too. The launcher exits with rank 1's
    code (mpirun: Open MPI picks a failing rank's code), quickly, with nothing left."""
    script = (
        "import sys, torch, tutti.torch as hvd\n"
        "hvd.init()\n"
        "t = torch.ones(4)\n"
        "for step in range(200):\n"
        "    if step == 5 and hvd.rank() == 1:\n"
        "        %s\n"
        "    hvd.allreduce(t, name='step.%%d' %% step)\n" % leave)
    rc, wall, out, left = launch(launcher, 2, script)
    what = "%s: rc %s after %.1f s, left %s\n%s" % (launcher, rc, wall, left, out)
    assert left == [], what
    assert rc != 0, what
    if launcher != "mpirun":
        assert rc == code, what
    assert "rank 1 called shutdown" in out, what
    assert wall < TIMEOUT + 20, what  # + interpreter starts on 2 shared cores
