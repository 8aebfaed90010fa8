"""Jobs under launchers other than tuttirun, Open MPI and Slurm (docs/env_vars.md, "Topology"):
torchrun's workers (a C program and a tutti.torch script) and, where MPICH is installed,
hydra's are one job of 2 ranks over gloo; rank 0 warns once of Horovod variables Tutti does
not read and of misspelt TUTTI_ names; launcher variables it cannot use are said to be so.

Environment: LAUNCHER_DRIVER (test/integration/launcher_driver.c), TORCHRUN, TORCH_PYTHON and
TORCH_PYTHONPATH (tutti.torch for that Python), MPIRUN (Open MPI's, may be empty), HYDRA
(mpiexec.hydra, may be empty: those tests are skipped)."""
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import unittest

DRIVER = os.environ.get("LAUNCHER_DRIVER", "")
TORCHRUN = os.environ.get("TORCHRUN", "")
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "")
TORCH_PYTHONPATH = os.environ.get("TORCH_PYTHONPATH", "")
MPIRUN = os.environ.get("MPIRUN", "")
HYDRA = os.environ.get("HYDRA", "") or shutil.which("mpiexec.hydra") or ""
DEADLINE = 90  # seconds per job

TORCH_SCRIPT = """
import torch
import tutti.torch as hvd
hvd.init()
assert hvd.size() == 2, hvd.size()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="sum")
assert total.item() == 3.0, total
print("torch script: rank %d of %d: PASSED" % (hvd.rank(), hvd.size()), flush=True)
hvd.shutdown()
"""


def free_port_pair():
    """A port p with p and p + 1 free on 127.0.0.1 (torch's store, Tutti's server)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two consecutive free ports")


class LauncherJobs(unittest.TestCase):
    def setUp(self):
        # A home of its own: the test sees whether rank 0 makes ~/.tutti/secret.
        self.home = tempfile.mkdtemp(prefix="tutti-launchers-")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("TUTTI_", "HOROVOD_", "OMPI_", "PMI", "SLURM_"))
                    and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        self.env.update(HOME=self.home, TUTTI_TIMEOUT_SECONDS="60",
                        TUTTI_START_TIMEOUT_SECONDS="30", OMPI_ALLOW_RUN_AS_ROOT="1",
                        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def tearDown(self):
        shutil.rmtree(self.home, ignore_errors=True)

    def run_job(self, argv, env=None):
        proc = subprocess.run(argv, env=env or self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=DEADLINE,
                              stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout, proc.stderr

    def check_secret_made(self):
        path = os.path.join(self.home, ".tutti", "secret")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        self.assertEqual(mode, 0o600, oct(mode))
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
        with open(path) as f:
            self.assertRegex(f.read(), r"^[0-9a-f]{64}\n$")

    @unittest.skipUnless(TORCHRUN and DRIVER, "no torchrun")
    def test_torchrun_c_program_is_one_job(self):
        port = free_port_pair()
        code, out, err = self.run_job([TORCHRUN, "--nproc_per_node", "2", "--master_port",
                                       str(port), "--no-python", DRIVER, "2"])
        self.assertEqual(code, 0, out + err)
        for rank in (0, 1):
            self.assertIn("launcher_driver: rank %d of 2: PASSED" % rank, out)
        self.check_secret_made()

    @unittest.skipUnless(TORCHRUN and TORCH_PYTHONPATH, "no torchrun or tutti.torch")
    def test_torchrun_tutti_torch_script_is_one_job(self):
        script = os.path.join(self.home, "train.py")
        with open(script, "w") as f:
            f.write(TORCH_SCRIPT)
        env = dict(self.env, PYTHONPATH=TORCH_PYTHONPATH, PYTHONDONTWRITEBYTECODE="1")
        code, out, err = self.run_job([TORCHRUN, "--nproc_per_node", "2", "--master_port",
                                       str(free_port_pair()), script], env)
        self.assertEqual(code, 0, out + err)
        for rank in (0, 1):
            self.assertIn("torch script: rank %d of 2: PASSED" % rank, out)

    def test_torchrun_port_taken_is_named(self):
        # Rank 0 of what torchrun gives a worker, started alone: it serves first, so a
        # taken port fails it at once (no torchrun needed for that).
        port = free_port_pair()
        env = dict(self.env, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="t1",
                   TUTTI_START_TIMEOUT_SECONDS="5")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", port + 1))
            taken.listen()
            code, out, err = self.run_job([DRIVER, "2"], env)
        self.assertNotEqual(code, 0)
        self.assertIn("gloo under torchrun: rank 0", out + err)
        self.assertIn("MASTER_PORT %d + 1" % port, out + err)
        self.assertIn("TUTTI_RENDEZVOUS_PORT", out + err)

    def test_warnings_once_on_rank_zero(self):
        env = dict(self.env, HOROVOD_TORUS_ALLREDUCE="1", HOROVOD_CONTROLLER="gloo",
                   HOROVOD_CYCLE_TIME="2", TUTTI_FUSION_THRESHHOLD="1024")
        if MPIRUN:
            argv = [MPIRUN, "-np", "2", "--oversubscribe", "--bind-to", "none", DRIVER, "2"]
        elif TORCHRUN:
            argv = [TORCHRUN, "--nproc_per_node", "2", "--master_port",
                    str(free_port_pair()), "--no-python", DRIVER, "2"]
        else:
            self.skipTest("no launcher")
        code, out, err = self.run_job(argv, env)
        self.assertEqual(code, 0, out + err)
        # One line from the two ranks: rank 0's.
        warnings = [line for line in err.splitlines() if "[tutti warning" in line]
        self.assertEqual(len(warnings), 1, err)
        line = warnings[0]
        self.assertIn("HOROVOD_TORUS_ALLREDUCE is not read by Tutti", line)
        self.assertIn("HOROVOD_CONTROLLER is not read by Tutti", line)
        self.assertIn("TUTTI_FUSION_THRESHHOLD is not a Tutti variable and is ignored: did you "
                      "mean TUTTI_FUSION_THRESHOLD?", line)
        self.assertNotIn("HOROVOD_CYCLE_TIME is not", line)  # a twin: read, not warned of
        self.assertNotIn("#", line)

    def test_torch_variables_without_master_are_said_unusable(self):
        env = dict(self.env, RANK="0", WORLD_SIZE="2")
        code, out, err = self.run_job([DRIVER, "1"], env)
        self.assertEqual(code, 0, out + err)
        self.assertIn("RANK=0 and WORLD_SIZE=2 are set (torch.distributed's) but MASTER_ADDR "
                      "and MASTER_PORT are not", err)

    @unittest.skipUnless(HYDRA and DRIVER, "no mpiexec.hydra (Debian package mpich)")
    def test_hydra_job_is_one_job(self):
        port = free_port_pair()
        code, out, err = self.run_job([HYDRA, "-n", "2", "-genv", "TUTTI_RENDEZVOUS_PORT",
                                       str(port), DRIVER, "2"])
        self.assertEqual(code, 0, out + err)
        for rank in (0, 1):
            self.assertIn("launcher_driver: rank %d of 2: PASSED" % rank, out)
        code, out, err = self.run_job([HYDRA, "-n", "2", DRIVER, "2"])
        self.assertNotEqual(code, 0)
        self.assertIn("gloo under hydra (PMI_RANK 0 of PMI_SIZE 2)", out + err)
        self.assertIn("set TUTTI_RENDEZVOUS_PORT", out + err)


if __name__ == "__main__":
    unittest.main()
