"""Jobs under a real one-node Slurm (slurm.sh: Debian's munged, slurmctld and slurmd, started
for the test and stopped after it, also when a test fails).

gloo under plain srun (rank 0 hosts the rendezvous; no tuttirun) and MPI under
srun --mpi=pmix: per-rank topology with and without --ntasks-per-node, an integration
program, an sbatch script, the errors of a missing secret and of srun without --mpi=pmix,
and a task that exits 7 mid-job: srun ends within the deadline, the other tasks say why,
and nothing is left. torch.distributed's backend "tutti" started with no arguments in srun's
tasks (DDP against gloo, every collective at 3 ranks).

Needs root and Debian's slurmctld, slurmd and munge; skipped (exit code 77 for CTest)
without them. Environment (set by CTest): PROBE, INTEG_DIR, EXIT_DRIVER, WITH_MPI, and
TORCH_PYTHON, TORCH_PYTHONPATH, TORCH_WORKER where the build has tutti.torch for torch 2.x.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SLURM_SH = os.path.join(HERE, "slurm.sh")
STATE = os.environ.setdefault("TUTTI_SLURM_DIR", "/tmp/tutti-slurm")
PROBE = os.environ.get("PROBE", "")
INTEG_DIR = os.environ.get("INTEG_DIR", "")
EXIT_DRIVER = os.environ.get("EXIT_DRIVER", "")
WITH_MPI = os.environ.get("WITH_MPI", "").upper() in ("1", "ON", "TRUE", "YES")
# torch 2.x's Python with tutti.torch on TORCH_PYTHONPATH, and the torch.distributed worker
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "")
TORCH_PYTHONPATH = os.environ.get("TORCH_PYTHONPATH", "")
TORCH_WORKER = os.environ.get("TORCH_WORKER", "")
SKIP_CODE = 77
SECRET = os.urandom(32).hex()
DEADLINE = 10  # TUTTI_TIMEOUT_SECONDS in the failure test
# The whole run's deadline, so that Slurm is stopped (up to 60 s) before CTest's 240 s
# TIMEOUT kills this process, which would leave the daemons running.
RUN_DEADLINE = 170
HOST = os.uname().nodename.split(".")[0]


def why_not_runnable():
    if os.geteuid() != 0:
        return "needs root (slurmd runs the tasks)"
    for daemon in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"):
        if not os.path.exists(daemon):
            return "needs %s (apt-get install slurmctld slurmd munge)" % daemon
    if not shutil.which("srun"):
        return "needs srun (slurm-client)"
    if not PROBE or not os.path.exists(PROBE):
        return "PROBE (the probe program) not built"
    return None


def slurm(*args):
    return subprocess.run(["bash", SLURM_SH] + list(args), timeout=60, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def job_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TUTTI_", "OMPI_", "PMIX_", "PMI_"))}
    env.update(SLURM_CONF=os.path.join(STATE, "slurm.conf"), TUTTI_SECRET=SECRET,
               TUTTI_START_TIMEOUT_SECONDS="20", TUTTI_TIMEOUT_SECONDS="60")
    env.update(extra)
    return env


def run(args, timeout=60, **extra):
    """Runs a Slurm command; returns (exit code, output, seconds). A job still running at
    the deadline is cancelled (scancel), so a hang fails the test and leaves nothing."""
    start = time.monotonic()
    proc = subprocess.Popen(args, env=job_env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", "--full", "--quiet", "--user=root"], env=job_env(),
                       timeout=20)
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate(timeout=20)
        out += "\n[test: still running after %d s; cancelled]" % timeout
    return proc.returncode, out, time.monotonic() - start


def topo(out):
    """{rank: (host, size, local_rank, local_size, cross_rank, cross_size)} from probe."""
    rows = {}
    for m in re.finditer(r"^TOPO (\S+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", out, re.M):
        values = [int(x) for x in m.groups()[1:]]
        rows[values[0]] = (m.group(1), values[1], values[2], values[3], values[4], values[5])
    return rows


def leftovers(*programs):
    """Processes of the given programs still running, and jobs Slurm still lists."""
    left = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if argv0 in programs:
            left.append("pid %s %s" % (pid, argv0))
    squeue = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=job_env(), timeout=20,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return left + [line for line in squeue.stdout.splitlines() if line.strip()]


def wait_nothing_left(*programs, within=10.0):
    end = time.monotonic() + within
    left = leftovers(*programs)
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = leftovers(*programs)
    return left


def setUpModule():
    up = slurm("up")
    if up.returncode != 0:
        slurm("down")
        raise RuntimeError("slurm.sh up failed:\n" + up.stdout)


def tearDownModule():
    slurm("down")


class SlurmCases:
    """The cases run for both backends (mixed into a TestCase below)."""
    MPI = False

    def srun(self, n, *args, per_node=None, timeout=60, **extra):
        cmd = ["srun", "-n", str(n)]
        if per_node:
            cmd += ["--ntasks-per-node=%d" % per_node]
        if self.MPI:
            cmd += ["--mpi=pmix"]
        else:
            extra.setdefault("TUTTI_CPU_OPERATIONS", "gloo")
        return run(cmd + list(args), timeout=timeout, **extra)

    def check_topology(self, n, per_node=None):
        rc, out, _ = self.srun(n, PROBE, "topology", per_node=per_node)
        self.assertEqual(rc, 0, out)
        rows = topo(out)
        self.assertEqual(sorted(rows), list(range(n)), out)
        for rank, (host, size, lr, ls, cr, cs) in rows.items():
            self.assertEqual((host, size, lr, ls, cr, cs), (HOST, n, rank, n, 0, 1), out)

    def test_topology_without_ntasks_per_node(self):
        self.check_topology(3)

    def test_topology_with_ntasks_per_node(self):
        self.check_topology(4, per_node=4)

    def test_integration_programs(self):
        """Allreduces, and init after shutdown (gloo: rank 0's server made anew each time)."""
        for name in ("integ_allreduce", "integ_lifecycle"):
            program = os.path.join(INTEG_DIR, name)
            if not os.path.exists(program):
                self.skipTest(name + " not built")
            rc, out, _ = self.srun(3, program, timeout=120)
            self.assertEqual(rc, 0, name + ":\n" + out)

    def test_sbatch_script(self):
        """The docs' sbatch example: srun in a batch script, waited for with a deadline."""
        launch = ("srun --mpi=pmix" if self.MPI
                  else "export TUTTI_CPU_OPERATIONS=gloo\nsrun")
        with tempfile.TemporaryDirectory(prefix="tutti-slurm-sbatch-") as tmp:
            script = os.path.join(tmp, "job.sh")
            output = os.path.join(tmp, "job.out")
            with open(script, "w") as f:
                f.write("#!/bin/bash\n#SBATCH -n 3\n#SBATCH --time=1\n%s %s topology\n"
                        % (launch, PROBE))
            rc, out, _ = run(["sbatch", "--wait", "-o", output, script], timeout=60)
            with open(output) as f:
                job_out = f.read()
        self.assertEqual(rc, 0, out + job_out)
        self.assertEqual(sorted(topo(job_out)), [0, 1, 2], job_out)
        self.assertEqual(wait_nothing_left(PROBE), [])

    def test_task_exits_7(self):
        """Rank 2 exits 7 after 3 steps; the others' ops fail naming it; srun ends."""
        if not EXIT_DRIVER or not os.path.exists(EXIT_DRIVER):
            self.skipTest("integ_exit_driver not built")
        rc, out, took = self.srun(3, EXIT_DRIVER, "exit", "2", "7",
                                  timeout=DEADLINE + 30, TUTTI_TIMEOUT_SECONDS=str(DEADLINE))
        self.assertNotEqual(rc, 0, out)
        self.assertIn("rank 2: leaving by exit", out)
        self.assertRegex(out, r"task 2: Exited with exit code 7", out)
        self.assertRegex(out, r"rank [01]: FAILED: .*rank 2 left the job \(exited with code 7\)",
                         out)
        self.assertLess(took, DEADLINE + 10, out)
        self.assertEqual(wait_nothing_left(EXIT_DRIVER), [])


class GlooUnderSrun(SlurmCases, unittest.TestCase):
    def test_no_secret_is_an_error(self):
        with tempfile.TemporaryDirectory(prefix="tutti-slurm-home-") as home:
            rc, out, took = self.srun(2, PROBE, "topology", TUTTI_SECRET="", HOME=home)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("no job secret", out)
        self.assertIn("openssl rand -hex 32", out)
        self.assertLess(took, 15, out)

    def test_port_in_use_is_named(self):
        """Another program holds the port: rank 0 says so; the others give up in time."""
        holder = socket.socket()
        holder.bind(("0.0.0.0", 0))
        holder.listen(4)
        port = holder.getsockname()[1]
        try:
            rc, out, took = self.srun(2, PROBE, "topology", TUTTI_START_TIMEOUT_SECONDS="3",
                                      TUTTI_RENDEZVOUS_PORT=str(port))
        finally:
            holder.close()
        self.assertNotEqual(rc, 0, out)
        self.assertIn("rank 0: rendezvous server: cannot listen on *:%d" % port, out)
        self.assertIn("set TUTTI_RENDEZVOUS_PORT", out)
        self.assertIn("rank 1 could not reach rank 0's rendezvous server", out)
        self.assertLess(took, 15, out)

    def test_port_override_and_a_secret_file(self):
        with tempfile.TemporaryDirectory(prefix="tutti-slurm-home-") as home:
            os.mkdir(os.path.join(home, ".tutti"), 0o700)
            path = os.path.join(home, ".tutti", "secret")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(SECRET + "\n")
            rc, out, _ = self.srun(2, PROBE, "topology", TUTTI_SECRET="", HOME=home,
                                   TUTTI_RENDEZVOUS_PORT="31999")
        self.assertEqual(rc, 0, out)
        self.assertEqual(sorted(topo(out)), [0, 1], out)


@unittest.skipUnless(TORCH_PYTHON and TORCH_WORKER, "no tutti.torch for torch 2.x in this build")
class TorchDistributedUnderSrun(unittest.TestCase):
    """dist.init_process_group("tutti") with no arguments in srun's tasks: importing
    tutti.torch sets torch's variables from Slurm's (docs/pytorch.md)."""

    def worker(self, n, *args, timeout=120):
        rc, out, _ = run(["srun", "-n", str(n), TORCH_PYTHON, TORCH_WORKER] + list(args),
                         timeout=timeout, PYTHONPATH=TORCH_PYTHONPATH,
                         PYTHONWARNINGS="ignore::FutureWarning")
        self.assertEqual(rc, 0, out[-6000:])
        self.assertEqual(out.count("OK %s" % args[0]), n, out[-6000:])
        self.assertEqual(wait_nothing_left(TORCH_PYTHON), [])
        return out

    def test_ddp_matches_gloo(self):
        """DDP on tutti and on gloo, each in a job step of its own: the same bits."""
        with tempfile.TemporaryDirectory(prefix="tutti-slurm-ddp-") as tmp:
            paths = {b: os.path.join(tmp, b + ".pt") for b in ("gloo", "tutti")}
            for backend, path in paths.items():
                self.worker(2, "ddp", "--backends", backend, "--save", path)
            same = subprocess.run(
                [TORCH_PYTHON, "-c", "import sys, torch; a, b = (torch.load(p) for p in "
                 "sys.argv[1:]); sys.exit(0 if len(a) == len(b) and all(torch.equal(x, y) "
                 "for x, y in zip(a, b)) else 'parameters differ')",
                 paths["gloo"], paths["tutti"]], timeout=60, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.assertEqual(same.returncode, 0, same.stdout)

    def test_collectives_at_3_ranks(self):
        self.worker(3, "collectives")


@unittest.skipUnless(WITH_MPI, "built without MPI")
class MpiUnderSrun(SlurmCases, unittest.TestCase):
    MPI = True

    @classmethod
    def setUpClass(cls):
        rc, out, _ = run(["srun", "--mpi=list"], timeout=30)
        if "pmix" not in out:
            raise unittest.SkipTest("this Slurm has no PMIx plugin (srun --mpi=list: %s)" % out)

    def test_without_pmix_names_the_fix(self):
        rc, out, took = run(["srun", "-n", "2", PROBE, "topology"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn("srun --mpi=pmix", out)
        self.assertIn("srun --mpi=list", out)
        self.assertNotIn("OMPI was not built with SLURM's PMI support", out)
        self.assertLess(took, 15, out)

def stop_at_run_deadline(signum, frame):
    print("test_slurm: still running after %d s: stopping Slurm (slurm.sh down) and failing"
          % RUN_DEADLINE, flush=True)
    down = slurm("down")
    print(down.stdout, flush=True)
    os._exit(1)


if __name__ == "__main__":
    reason = why_not_runnable()
    if reason:
        print("SKIPPED: " + reason)
        sys.exit(SKIP_CODE)
    signal.signal(signal.SIGALRM, stop_at_run_deadline)
    signal.alarm(RUN_DEADLINE)
    unittest.main(verbosity=2)
