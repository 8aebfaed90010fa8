"""The torch.distributed backend "tutti" (docs/pytorch.md, "torch.distributed backend"): jobs
of torch_dist_worker.py under torchrun (env://), tuttirun and mpirun (no arguments), and as
plain processes with tcp:// and file:// init methods. Runs only where
TUTTI_DISTRIBUTED_TESTS=1 (its CTest entry: each test starts jobs of its own, so it must not
run once per rank of the per-rank suites). Every job has a deadline; what outlives it is
killed."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_DISTRIBUTED_TESTS") != "1",
                                reason="set TUTTI_DISTRIBUTED_TESTS=1 (and TUTTIRUN, MPIRUN)")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_dist_worker.py")
LIMIT = 150  # seconds for each job


def job_env(**extra):
    env = dict(os.environ)
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
              "TUTTI_RANK", "TUTTI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        env.pop(v, None)
    env.setdefault("TUTTI_TIMEOUT_SECONDS", "60")
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env.update(extra)
    return env


def run(cmd, env=None, limit=LIMIT):
    """Runs a launcher's job to the end (killing its process group after `limit`)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or job_env(), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("%s outlived its %d s deadline:\n%s" % (" ".join(cmd), limit, out[-6000:]))
    return proc.returncode, out


def run_ranks(n, args, env=None, limit=LIMIT):
    """Starts n worker processes (--rank i --size n), no launcher; returns [(rc, output)]."""
    procs = [subprocess.Popen([sys.executable, WORKER] + args + ["--rank", str(i), "--size",
                                                                  str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env or job_env(), start_new_session=True)
             for i in range(n)]
    deadline = time.monotonic() + limit
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            out, _ = p.communicate()
            pytest.fail("rank %d outlived the %d s deadline:\n%s" % (procs.index(p), limit,
                                                                     out[-6000:]))
        results.append((p.returncode, out))
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n, args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(n), WORKER] + args


def launcher(name):
    path = os.environ.get(name)
    if not path:
        pytest.skip("%s is not set (no such launcher in this build)" % name)
    return path


def mpirun_cmd(n, args):
    return [launcher("MPIRUN"), "-np", str(n), "--oversubscribe", "--bind-to", "none",
            "-x", "PYTHONPATH", "-x", "TUTTI_TIMEOUT_SECONDS", "-x", "PYTHONWARNINGS",
            sys.executable, WORKER] + args


def mpi_env():
    return job_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")


def assert_ok(rc, out, mode, ranks):
    assert rc == 0, out[-6000:]
    assert out.count("OK %s" % mode) == ranks, out[-6000:]


def test_collectives_under_torchrun():
    rc, out = run(torchrun(2, ["collectives"]))
    assert_ok(rc, out, "collectives", 2)


def test_collectives_with_tcp_init_at_3_ranks():
    results = run_ranks(3, ["collectives", "--init-method",
                            "tcp://127.0.0.1:%d" % free_port()])
    for rc, out in results:
        assert_ok(rc, out, "collectives", 1)


@pytest.fixture(scope="module")
def gloo_params(tmp_path_factory):
    """The reference: DDP's parameters after training on gloo under torchrun."""
    path = str(tmp_path_factory.mktemp("ddp") / "gloo.pt")
    rc, out = run(torchrun(2, ["ddp", "--backends", "gloo", "--save", path]))
    assert_ok(rc, out, "ddp", 2)
    return path


def same_params(a_path, b_path):
    import torch
    a, b = torch.load(a_path), torch.load(b_path)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), "parameters differ by up to %s" % (x - y).abs().max()


def test_ddp_under_torchrun_matches_gloo_and_reinit(gloo_params, tmp_path):
    """Trains twice in one process (destroy_process_group, then init again; the second run
    with a DDP comm hook, which waits on the Work's Future): the same bits as gloo's."""
    path = str(tmp_path / "tutti.pt")
    rc, out = run(torchrun(2, ["ddp", "--backends", "tutti,tutti", "--save", path]))
    assert_ok(rc, out, "ddp", 2)
    same_params(gloo_params, path)


def test_ddp_under_tuttirun_matches_gloo(gloo_params, tmp_path):
    path = str(tmp_path / "tutti.pt")
    rc, out = run([launcher("TUTTIRUN"), "-np", "2", sys.executable, WORKER, "ddp",
                   "--backends", "tutti", "--save", path])
    assert_ok(rc, out, "ddp", 2)
    same_params(gloo_params, path)


def test_ddp_under_mpirun_matches_gloo(gloo_params, tmp_path):
    # A device-qualified backend: CPU tensors on tutti (CUDA ones would go to gloo).
    path = str(tmp_path / "tutti.pt")
    rc, out = run(mpirun_cmd(2, ["ddp", "--backends", "cpu:tutti,cuda:gloo", "--save", path]),
                  env=mpi_env())
    assert_ok(rc, out, "ddp", 2)
    same_params(gloo_params, path)


def test_fsdp2_under_torchrun_matches_gloo():
    """FSDP2 (fully_shard: all_gather_into_tensor, reduce_scatter_tensor) at 2 ranks: the
    same bits as gloo's, compared within the job."""
    rc, out = run(torchrun(2, ["fsdp", "--backends", "tutti,gloo"]))
    assert_ok(rc, out, "fsdp", 2)


def test_fsdp2_under_mpirun_matches_gloo():
    rc, out = run(mpirun_cmd(2, ["fsdp", "--backends", "tutti,gloo"]), env=mpi_env())
    assert_ok(rc, out, "fsdp", 2)


def test_fsdp2_at_3_ranks_under_tuttirun_matches_gloo():
    """At 3 ranks the two backends may add in other orders: within 1e-6."""
    rc, out = run([launcher("TUTTIRUN"), "-np", "3", sys.executable, WORKER, "fsdp",
                   "--backends", "tutti,gloo"])
    assert_ok(rc, out, "fsdp", 3)


def test_ddp_at_3_ranks_under_torchrun_matches_gloo():
    rc, out = run(torchrun(3, ["ddp", "--backends", "tutti,gloo"]))
    assert_ok(rc, out, "ddp", 3)


def launch(how, n, args):
    """(command, env) of a job of n workers under torchrun, tuttirun or mpirun."""
    if how == "torchrun":
        return torchrun(n, args), None
    if how == "tuttirun":
        return [launcher("TUTTIRUN"), "-np", str(n), sys.executable, WORKER] + args, None
    return mpirun_cmd(n, args), mpi_env()


@pytest.mark.parametrize("mode,n,how", [("ddp", 3, "tuttirun"), ("ddp", 3, "mpirun"),
                                        ("fsdp", 2, "tuttirun"), ("fsdp", 3, "torchrun"),
                                        ("fsdp", 3, "mpirun")])
def test_the_rest_of_the_launcher_matrix(mode, n, how):
    """With the tests above, DDP and FSDP2 each run at 2 and 3 ranks under torchrun, tuttirun
    and mpirun (tuttirun and mpirun with no init arguments), against gloo in the job."""
    cmd, env = launch(how, n, [mode, "--backends", "tutti,gloo"])
    rc, out = run(cmd, env=env)
    assert_ok(rc, out, mode, n)


@pytest.mark.parametrize("n", [2, 3])
def test_a_killed_rank_ends_the_job_naming_it(tmp_path, n):
    """Rank 1 kills itself mid-DDP: every survivor fails (DistBackendError, whether its
    collective was under way or could not start any more) naming it within 10 s of the kill,
    long before the 30 s timeout (the runtime sees the process gone), and every process
    has ended."""
    url = "file://" + str(tmp_path / "store")
    t0 = time.monotonic()
    results = run_ranks(n, ["kill", "--init-method", url], env=job_env(TUTTI_TIMEOUT_SECONDS="30"),
                        limit=90)
    took = time.monotonic() - t0
    assert results[1][0] == -signal.SIGKILL, results[1][1][-3000:]
    killed_at = float(re.search(r"killing itself at step \d+ at ([\d.]+)", results[1][1]).group(1))
    for rank in [r for r in range(n) if r != 1]:
        rc, out = results[rank]
        assert rc == 3, out[-6000:]
        line = [l for l in out.splitlines() if "FAILED AS EXPECTED" in l][0]
        assert "DistBackendError" in line and "rank 1" in line, line
        failed_at = float(re.search(r"failed at ([\d.]+)", out).group(1))
        assert failed_at - killed_at < 10, "rank %d failed %.1f s after the kill" % (
            rank, failed_at - killed_at)
    assert took < 90


def test_mismatched_collectives_are_an_error_on_every_rank(tmp_path):
    url = "file://" + str(tmp_path / "store")
    for rc, out in run_ranks(2, ["mismatch", "--init-method", url], limit=90):
        assert rc == 3, out[-6000:]
        line = [l for l in out.splitlines() if "FAILED AS EXPECTED" in l][0]
        assert "c10d.0.1" in line and "collective 1 " in line, line  # by its number


def test_groups_of_some_ranks_at_3_ranks():
    """new_group, new_subgroups_by_enumeration (a group of one rank), DeviceMesh (3,) and
    (1, 3), destroying a group, monitored_barrier passing and naming absent ranks."""
    results = run_ranks(3, ["groups", "--init-method", "tcp://127.0.0.1:%d" % free_port()])
    for rc, out in results:
        assert_ok(rc, out, "groups", 1)


def test_groups_of_some_ranks_at_4_ranks_under_tuttirun_after_tutti_init():
    """The same at 4 ranks (new_subgroups, DeviceMesh (2, 2)) where the program started Tutti
    first: destroy_process_group() removes the groups' process sets, Tutti runs on."""
    rc, out = run([launcher("TUTTIRUN"), "-np", "4", sys.executable, WORKER, "groups",
                   "--tutti-init"])
    assert_ok(rc, out, "groups", 4)


def test_mismatch_on_a_subgroup_names_the_group(tmp_path):
    url = "file://" + str(tmp_path / "store")
    results = run_ranks(3, ["mismatch", "--subgroup", "--init-method", url], limit=90)
    assert_ok(results[1][0], results[1][1], "mismatch", 1)  # not a member: untouched
    for rc, out in (results[0], results[2]):
        assert rc == 3, out[-6000:]
        line = [l for l in out.splitlines() if "FAILED AS EXPECTED" in l][0]
        assert "process group '1'" in line and "c10d.1.1" in line, line


def test_launcher_defaults():
    from tutti.torch import distributed as td
    env = {"TUTTI_RANK": "1", "TUTTI_SIZE": "2", "TUTTI_LOCAL_RANK": "1",
           "TUTTI_LOCAL_SIZE": "2", "TUTTI_RENDEZVOUS_ADDR": "127.0.0.1",
           "TUTTI_RENDEZVOUS_PORT": "4000"}
    got = td.launcher_defaults(env)
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "2" and got["LOCAL_RANK"] == "1"
    assert got["MASTER_ADDR"] == "127.0.0.1" and 20000 <= int(got["MASTER_PORT"]) < 30000
    assert td.launcher_defaults(dict(env, MASTER_PORT="1234")) == {}  # torch's own win
    assert td.launcher_defaults(dict(env, TUTTI_LOCAL_SIZE="1")) == {}  # several hosts
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "PMIX_NAMESPACE": "123"}
    assert td.launcher_defaults(ompi)["WORLD_SIZE"] == "3"
    # srun's task of a job step on one node; the next step of the job gets another port
    slurm = {"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "3", "SLURM_LOCALID": "2",
             "SLURM_STEP_NUM_NODES": "1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
             "SLURM_NTASKS": "3"}
    got = td.launcher_defaults(slurm)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["MASTER_ADDR"]) == \
        ("2", "3", "2", "127.0.0.1")
    assert got["MASTER_PORT"] != td.launcher_defaults(dict(slurm, SLURM_STEP_ID="1"))["MASTER_PORT"]
    assert td.launcher_defaults(dict(slurm, SLURM_STEP_NUM_NODES="2")) == {}  # several hosts
    no_step = dict(slurm)
    del no_step["SLURM_STEP_ID"]  # a batch script itself: one process, not a job's rank
    assert td.launcher_defaults(no_step) == {}
    assert td.is_registered()
