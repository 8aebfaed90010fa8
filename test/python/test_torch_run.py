"""tutti.run(fn, np=...): horovod.run's equivalent starts tuttirun and returns every rank's
return value in rank order. Runs only where TUTTI_RUN_TESTS=1 (its CTest entry: each test
starts a job of its own, so it must not run once per rank of the per-rank suites)."""

import os
import subprocess
import sys

import pytest

import tutti

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_RUN_TESTS") != "1",
                                reason="set TUTTI_RUN_TESTS=1 (and TUTTIRUN) to run")

LIMIT = 120  # seconds for each job


def reduce_ranks(scale, offset=0):
    """Runs in the job: a collective, so each result depends on every rank."""
    import torch
    import tutti.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="run.sum")
    return {"rank": hvd.rank(), "size": hvd.size(), "value": scale * total.item() + offset}


def launcher_rank():
    """Runs in the job without torch (quick to start): the rank the launcher gave."""
    for variable in ("TUTTI_RANK", "OMPI_COMM_WORLD_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    raise KeyError("no rank in the environment")


def fail_on_rank_one():
    if launcher_rank() == 1:
        raise KeyError("rank one failed on purpose")
    return 0


def test_run_returns_results_in_rank_order():
    results = tutti.run(reduce_ranks, args=(2.0,), kwargs={"offset": 1}, np=2, timeout=LIMIT)
    assert results == [{"rank": r, "size": 2, "value": 2.0 * 3 + 1} for r in range(2)]


def test_run_under_mpi_and_with_num_proc():
    if not os.environ.get("MPIRUN"):
        pytest.skip("no MPI build")
    assert tutti.run(launcher_rank, num_proc=3, use_mpi=True, timeout=LIMIT) == [0, 1, 2]


def test_run_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match="(?s)rank 1.*KeyError.*rank one failed"):
        tutti.run(fail_on_rank_one, np=2, timeout=LIMIT)


def test_run_argument_errors():
    with pytest.raises(ValueError, match="hosts or hostfile"):
        tutti.run(reduce_ranks, np=2, hosts="localhost:2", hostfile="hosts.txt")
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        tutti.run(reduce_ranks, np=2, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="num_proc"):
        tutti.run(reduce_ranks, np=0)


def test_tutti_run_imports_without_torch():
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "import tutti\n"
            "assert callable(tutti.run)\n"
            "assert not [m for m in sys.modules if m.startswith('torch') and sys.modules[m]]\n")
    done = subprocess.run([sys.executable, "-c", code], timeout=LIMIT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert done.returncode == 0, done.stdout.decode()
