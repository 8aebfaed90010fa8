"""How tutti.tensorflow jobs end (docs/architecture.md, "Exits and failures"), as
test/python/test_torch_exit.py checks for torch: a script that ends without shutdown, and a
rank that raises mid-job, under tuttirun --gloo and mpirun. Checks the launcher's exit code,
the wall time and that no process of the job is left (test/integration/exit_jobs.py).

These launch jobs of their own, so they run only from their own CTest entry
(tensorflow_exit, TUTTI_EXIT_TESTS=1), never inside the rank-per-process suites."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
from exit_jobs import LAUNCHERS, TIMEOUT, Job  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_EXIT_TESTS") != "1",
                                reason="launches jobs: run by the tensorflow_exit test")
# Each job starts TensorFlow in every rank (seconds): two launchers are enough here.
_LAUNCHERS = [l for l in LAUNCHERS if l in ("gloo", "mpirun")]


def launch(launcher, script):
    job = Job(launcher, 2, [sys.executable, "-c", script], limit=90,
              env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    return job.rc, job.wall, job.output, job.left


@pytest.mark.parametrize("launcher", _LAUNCHERS)
def test_exit_without_shutdown(launcher):
    rc, wall, out, left = launch(
        launcher, "import tensorflow as tf, tutti.tensorflow as hvd; hvd.init(); "
                  "print(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy())")
    what = "%s: rc %s after %.1f s, left %s\n%s" % (launcher, rc, wall, left, out)
    assert left == [], what
    assert rc == 0, what
    assert "[2. 2.]" in out, what
    assert wall < 60, what


@pytest.mark.parametrize("launcher", _LAUNCHERS)
def test_rank_that_raises(launcher):
    """Rank 1 raises mid-job; rank 0's next op fails with "rank 1 called shutdown" (a
    tf.errors.AbortedError, uncaught), and the job ends quickly with nothing left."""
    script = (
        "import tensorflow as tf, tutti.tensorflow as hvd\n"
        "hvd.init()\n"
        "t = tf.ones([4])\n"
        "for step in range(200):\n"
        "    if step == 5 and hvd.rank() == 1:\n"
        "        raise ValueError('bad batch')\n"
        "    hvd.allreduce(t, name='step.%d' % step)\n")
    rc, wall, out, left = launch(launcher, script)
    what = "%s: rc %s after %.1f s, left %s\n%s" % (launcher, rc, wall, left, out)
    assert left == [], what
    assert rc != 0, what
    if launcher != "mpirun":
        assert rc == 1, what
    assert "rank 1 called shutdown" in out, what
    assert "AbortedError" in out, what
    assert wall < TIMEOUT + 40, what
