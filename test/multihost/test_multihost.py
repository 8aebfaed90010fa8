"""Multi-host tests on simulated hosts (hosts.sh: network namespaces on a bridge, each with
its own host name and sshd), over gloo (tuttirun) and MPI (tuttirun --mpi, i.e. mpirun over
ssh): per-rank topology for even, uneven and repeated-name layouts, the integration suite
and the example trainer across hosts, the environment following the ranks, hierarchical
allreduce and allgather and the two-level AND (2 hosts x 2 ranks; again with pipelined
rounds forced on), and faults (a remote rank killed
with SIGKILL in a hierarchical allreduce, a host whose link goes down mid-job): the job ends
within its deadline naming the peer, the launcher exits non-zero, and nothing is left on any
host; an elastic job instead drops and blacklists the host whose link went down and goes on.

Needs root, iproute2 and openssh-server; skipped (exit code 77 for CTest) without them.
Environment (set by CTest): TUTTIRUN, PROBE, INTEG_DIR, TRAINER, ELASTIC_TRAINER.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS_SH = os.path.join(HERE, "hosts.sh")
STATE = os.environ.setdefault("TUTTI_MULTIHOST_DIR", "/tmp/tutti-multihost")
TUTTIRUN = os.environ.get("TUTTIRUN", "tuttirun")
PROBE = os.environ.get("PROBE", "")
INTEG_DIR = os.environ.get("INTEG_DIR", "")
TRAINER = os.environ.get("TRAINER", "")
ELASTIC_TRAINER = os.environ.get("ELASTIC_TRAINER", "")
SKIP_CODE = 77
DEADLINE = 8  # TUTTI_TIMEOUT_SECONDS in the fault tests
H = ["tutti-h1", "tutti-h2", "tutti-h3"]


def why_not_runnable():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "needs openssh-server (/usr/sbin/sshd)"
    if not shutil.which("ip"):
        return "needs iproute2"
    if not PROBE or not os.path.exists(PROBE):
        return "PROBE (the probe program) not built"
    return None


def hosts(*args, check=True):
    return subprocess.run(["bash", HOSTS_SH] + list(args), check=check, timeout=60,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def job_env(**extra):
    env = dict(os.environ)
    env["PATH"] = os.path.join(STATE, "bin") + os.pathsep + env["PATH"]
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.update(extra)
    return env


def launch(args, timeout=120, **extra):
    """Runs tuttirun with args; returns (exit code, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen([TUTTIRUN] + args, env=job_env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        raise AssertionError("tuttirun %s did not end within %d s:\n%s" %
                             (" ".join(args), timeout, out))
    return proc.returncode, out, time.monotonic() - start


def host_processes(host):
    """Processes in a host's namespace other than its sshd listener: what a job left."""
    pids = subprocess.run(["ip", "netns", "pids", host], stdout=subprocess.PIPE, text=True,
                          timeout=10).stdout.split()
    with open(os.path.join(STATE, "sshd-%s.pid" % host[len("tutti-h"):])) as f:
        listener = f.read().strip()
    left = []
    for pid in pids:
        if pid == listener:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        left.append("%s: %s" % (pid, cmd))
    return left


def local_leftovers(marker):
    out = subprocess.run(["pgrep", "-af", marker], stdout=subprocess.PIPE, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


class MultiHostCase(unittest.TestCase):
    def assert_nothing_left(self, within=15.0):
        """Every host's namespace holds only its sshd, and no probe runs here, within
        `within` seconds (remote sessions take a moment to close)."""
        end = time.monotonic() + within
        while True:
            left = {h: host_processes(h) for h in H}
            left = {h: p for h, p in left.items() if p}
            here = local_leftovers(PROBE) if PROBE else []
            if not left and not here:
                return
            if time.monotonic() > end:
                self.fail("processes left after the job: %r %r" % (left, here))
            time.sleep(0.25)


def topology_rows(out):
    rows = {}
    for line in out.splitlines():
        m = re.search(r"TOPO (\S+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)", line)
        if m:
            host = m.group(1)
            rank, size, lr, ls, cr, cs = map(int, m.groups()[1:])
            rows[rank] = (host, size, lr, ls, cr, cs)
    return rows


class TopologyTest(MultiHostCase):
    # rank -> (host, local rank, local size, cross rank, cross size), Horovod's definitions
    EVEN = {0: ("tutti-h1", 0, 2, 0, 2), 1: ("tutti-h1", 1, 2, 0, 2),
            2: ("tutti-h2", 0, 2, 1, 2), 3: ("tutti-h2", 1, 2, 1, 2)}
    UNEVEN = {0: ("tutti-h1", 0, 2, 0, 3), 1: ("tutti-h1", 1, 2, 0, 2),
              2: ("tutti-h2", 0, 2, 1, 3), 3: ("tutti-h2", 1, 2, 1, 2),
              4: ("tutti-h3", 0, 1, 2, 3)}

    def check(self, args, np, want):
        for mode in ("--gloo", "--mpi"):
            with self.subTest(mode=mode, args=args):
                rc, out, _ = launch(["-np", str(np), mode] + args + [PROBE, "topology"])
                self.assertEqual(rc, 0, out)
                rows = topology_rows(out)
                self.assertEqual(sorted(rows), list(range(np)), out)
                for rank, (host, lr, ls, cr, cs) in want.items():
                    self.assertEqual(rows[rank], (host, np, lr, ls, cr, cs),
                                     "rank %d under %s:\n%s" % (rank, mode, out))

    def test_even_layout(self):
        self.check(["-H", "tutti-h1:2,tutti-h2:2"], 4, self.EVEN)

    def test_uneven_layout(self):
        self.check(["-H", "tutti-h1:2,tutti-h2:2,tutti-h3:1"], 5, self.UNEVEN)

    def test_hostfile_naming_a_host_once_per_slot(self):
        with tempfile.NamedTemporaryFile("w", suffix=".nodes", delete=False) as f:
            f.write("tutti-h1\ntutti-h1\ntutti-h2\ntutti-h2\n")
        try:
            self.check(["--hostfile", f.name], 4, self.EVEN)
        finally:
            os.unlink(f.name)


class JobsAcrossHostsTest(MultiHostCase):
    def test_integration_suite_across_hosts(self):
        for mode in ("--gloo", "--mpi"):
            for binary in ("integ_allreduce", "integ_collectives"):
                with self.subTest(mode=mode, binary=binary):
                    rc, out, _ = launch(["-np", "4", mode, "-H",
                                         "tutti-h1:2,tutti-h2:1,tutti-h3:1",
                                         os.path.join(INTEG_DIR, binary)], timeout=240,
                                        TUTTI_TIMEOUT_SECONDS="60")
                    self.assertEqual(rc, 0, out[-4000:])
                    self.assertEqual(out.count("All tests passed"), 4, out[-4000:])
        self.assert_nothing_left()

    @unittest.skipUnless(TRAINER and os.path.exists(TRAINER), "trainer not built")
    def test_example_trainer_across_hosts(self):
        for mode in ("--gloo", "--mpi"):
            with self.subTest(mode=mode):
                rc, out, _ = launch(["-np", "3", mode, "-H",
                                     "tutti-h1:1,tutti-h2:1,tutti-h3:1", TRAINER,
                                     "--steps", "100"], timeout=180)
                self.assertEqual(rc, 0, out[-4000:])
                self.assertRegex(out, r"ranks 3 .*weights identical on all ranks: yes")

    def test_environment_follows_the_ranks(self):
        for mode in ("--gloo", "--mpi"):
            with self.subTest(mode=mode):
                rc, out, _ = launch(["-np", "2", mode, "-H", "tutti-h1:1,tutti-h2:1",
                                     "-x", "TUTTI_MH_OVERRIDDEN=from-x",
                                     PROBE, "env", "TUTTI_MH_FORWARDED"],
                                    TUTTI_MH_FORWARDED="from-here",
                                    TUTTI_MH_OVERRIDDEN="from-here")
                self.assertEqual(rc, 0, out)
                self.assertEqual(out.count("ENV TUTTI_MH_FORWARDED=from-here"), 2, out)
                rc, out, _ = launch(["-np", "2", mode, "-H", "tutti-h1:1,tutti-h2:1",
                                     "-x", "TUTTI_MH_OVERRIDDEN=from-x",
                                     PROBE, "env", "TUTTI_MH_OVERRIDDEN"],
                                    TUTTI_MH_OVERRIDDEN="from-here")
                self.assertEqual(rc, 0, out)
                self.assertEqual(out.count("ENV TUTTI_MH_OVERRIDDEN=from-x"), 2, out)


class HierarchicalTest(MultiHostCase):
    """2 hosts x 2 ranks: allreduce in two levels (shm inside each host, the transport
    across), forced on and off, every dtype x reduce op x count (0, 1,
    odd, ...) in and out of place plus 16 MiB ones (many 64 KiB shm chunks); the
    negotiation's AND in two levels in both; allgather in two levels."""
    LAYOUT = ["-np", "4", "-H", "tutti-h1:2,tutti-h2:2"]
    CASES = "allreduce every dtype*,large allreduces*"
    ENV = {}  # more environment for every job (the pipelined variant's TUTTI_PIPELINE=1)
    MODES = ("--gloo", "--mpi")

    def run_allreduce(self, mode, flag):
        rc, out, _ = launch(self.LAYOUT + [mode, flag, "--log-level", "info",
                                           os.path.join(INTEG_DIR, "integ_allreduce"),
                                           self.CASES],
                            timeout=240, TUTTI_TIMEOUT_SECONDS="60",
                            TUTTI_SHM_BUFFER_BYTES="65536", **self.ENV)
        self.assertEqual(rc, 0, out[-4000:])
        self.assertEqual(out.count("All tests passed"), 4, out[-4000:])
        self.assertIn("process set 0: negotiation ANDs in two levels (2 hosts with 2+2 "
                      "members)", out)
        return out

    def test_forced_on(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                out = self.run_allreduce(mode, "--hierarchical-allreduce")
                self.assertRegex(out, r"process set 0: first hierarchical allreduce \(\d+ "
                                      r"bytes; 2 hosts with 2\+2 members\)")
        self.assert_nothing_left()

    def test_forced_off(self):
        out = self.run_allreduce("--gloo", "--no-hierarchical-allreduce")
        self.assertNotIn("first hierarchical allreduce", out)

    def test_allgather_forced_on(self):
        """integ_collectives' allgather cases (every dtype; rows equal, differing per rank,
        none on some ranks, none at all) in two levels under --gloo."""
        rc, out, _ = launch(self.LAYOUT + ["--gloo", "--hierarchical-allgather",
                                           "--log-level", "info",
                                           os.path.join(INTEG_DIR, "integ_collectives"),
                                           "[allgather]"],
                            timeout=120, TUTTI_TIMEOUT_SECONDS="60", **self.ENV)
        self.assertEqual(rc, 0, out[-4000:])
        self.assertEqual(out.count("All tests passed"), 4, out[-4000:])
        self.assertRegex(out, r"process set 0: first hierarchical allgather \(\d+ bytes; "
                              r"2 hosts with 2\+2 members\)")

    @unittest.skipUnless(TRAINER and os.path.exists(TRAINER), "trainer not built")
    def test_autotune_switches_it_on_every_rank_at_once(self):
        """Autotune tries hierarchical allreduce off and on again (1 ms windows); the
        trainer's replicas stay identical, and every rank switched in the same round."""
        rc, out, _ = launch(self.LAYOUT + ["--gloo", "--autotune", "--log-level", "debug",
                                           TRAINER, "--steps", "400"],
                            timeout=180, TUTTI_AUTOTUNE_WINDOW_SECONDS="0.001",
                            TUTTI_AUTOTUNE_WARMUP_WINDOWS="0", TUTTI_AUTOTUNE_SAMPLES="1",
                            **self.ENV)
        self.assertEqual(rc, 0, out[-4000:])
        self.assertRegex(out, r"ranks 4 .*weights identical on all ranks: yes")
        self.assertRegex(out, r"autotune: done after 29 windows: .*, hierarchical allreduce "
                              r"o(n|ff)")
        changes = {r: re.findall(r"\[tutti debug rank %d\] autotune: (.*hierarchical "
                                 r"allreduce off from round \d+)" % r, out) for r in range(4)}
        self.assertTrue(changes[0], out[-4000:])
        for r in range(1, 4):
            self.assertEqual(changes[r], changes[0])


class HierarchicalPipelinedTest(HierarchicalTest):
    """The same with pipelined rounds forced on (auto leaves them off on small hosts such as
    CI's): the data plane on the execution stream's thread while the rounds negotiate, and
    autotune's switch a command between the same two plans on every rank. gloo only."""
    ENV = {"TUTTI_PIPELINE": "1"}
    MODES = ("--gloo",)

    def test_forced_off(self):
        self.skipTest("nothing hierarchical to pipeline (the flat path is covered elsewhere)")


class FaultTest(MultiHostCase):
    LAYOUT = ["-H", "tutti-h1:2,tutti-h2:2"]

    def start_loop(self, mode, seconds=120, deadline=DEADLINE, **extra):
        args = ["-np", "4", mode] + self.LAYOUT + [PROBE, "loop", str(seconds)]
        proc = subprocess.Popen([TUTTIRUN] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env=job_env(TUTTI_TIMEOUT_SECONDS=str(deadline),
                                            TUTTI_START_TIMEOUT_SECONDS="20", **extra))
        lines = []
        end = time.monotonic() + 60
        while time.monotonic() < end and sum("LOOPING" in l for l in lines) < 4:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        if sum("LOOPING" in l for l in lines) < 4:
            os.killpg(proc.pid, 9)
            self.fail("the job did not start looping:\n" + "".join(lines))
        return proc, lines

    def finish(self, proc, lines, limit):
        start = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            self.fail("tuttirun did not end within %d s of the fault:\n%s" %
                      (limit, "".join(lines) + out))
        return proc.returncode, "".join(lines) + out, time.monotonic() - start

    def probe_pids(self, host):
        return [p.split(":")[0] for p in host_processes(host) if PROBE in p and "sh -c" not in p]

    # The loop's allreduces run hierarchical (forced, should the default change): the kill
    # lands in one of its steps, inside a host or across.
    def test_remote_rank_killed(self):
        for mode in ("--gloo", "--mpi"):
            with self.subTest(mode=mode):
                proc, lines = self.start_loop(mode, TUTTI_HIERARCHICAL_ALLREDUCE="1")
                victims = self.probe_pids("tutti-h2")
                self.assertTrue(victims, "no probe found on tutti-h2")
                os.kill(int(victims[0]), 9)
                rc, out, took = self.finish(proc, lines, DEADLINE + 30)
                self.assertNotEqual(rc, 0, out)
                self.assertLess(took, DEADLINE + 30, out)
                if mode == "--gloo":
                    self.assertRegex(out, r"rank [23] .*(killed by signal 9|SIGKILL)", out)
                else:  # mpirun, or a rank of its host first: "world rank 2 (pid N) died"
                    self.assertRegex(out, r"rank [23] [^\n]*(signal 9|died)", out)
                self.assert_nothing_left()

    # Under MPI with a deadline longer than the 15 s in which tuttirun's keepalive settings
    # make Open MPI notice the lost host (the order of a real job: 30 minutes), mpirun ends
    # the job naming the host. With a shorter one a rank's failure comes first (it leaves
    # without finalizing, or calls MPI_Abort), which mpirun retransmits toward the lost host
    # for minutes: tuttirun stops it. Its daemon on
    # the lost host, stuck the same way, ends once the host is back. (Under gloo with a long
    # deadline ssh's keepalive ends the job 15-20 s after the loss, "rank 2 (pid N on
    # tutti-h2): ssh exited with code 255 (the connection to tutti-h2 failed or was lost)":
    # checked by hand, left out to keep this suite short.)
    def test_link_down(self):
        cases = [
            ("--gloo", 4, r"timed out (receiving from|sending to) world rank\(s\) [23]", True),
            ("--mpi", 30, r"lost communication with a remote daemon[\s\S]*tutti-h2", True),
            ("--mpi", 3, r"mpirun has not ended 10 s after rank [01] "
                      r"(called MPI_Abort|left after a fatal error)", False),
        ]
        for mode, deadline, peer, clean_while_down in cases:
            with self.subTest(mode=mode, deadline=deadline):
                proc, lines = self.start_loop(mode, deadline=deadline)
                hosts("link", "tutti-h2", "down")
                try:
                    rc, out, took = self.finish(proc, lines, 30)
                    self.assertNotEqual(rc, 0, out)
                    self.assertRegex(out, peer)
                    if clean_while_down:
                        # tutti-h2's sshd drops the sessions of the lost client
                        # (ClientAlive), and its ranks end by their own deadlines.
                        self.assert_nothing_left(within=10)
                finally:
                    hosts("link", "tutti-h2", "up")
                self.assert_nothing_left(within=15)
                print("link down under %s, TUTTI_TIMEOUT_SECONDS=%d: tuttirun ended %.1f s "
                      "later with code %d" % (mode, deadline, took, rc), file=sys.stderr)


class ElasticTest(MultiHostCase):
    """An elastic job (docs/elastic.md) on tutti-h1 and tutti-h2, the C++ elastic example."""

    @unittest.skipUnless(ELASTIC_TRAINER, "ELASTIC_TRAINER (examples/cpp/elastic_trainer.cc) "
                                          "not built")
    def test_host_whose_link_goes_down_is_dropped_and_blacklisted(self):
        args = ["-np", "4", "--min-np", "2", "--blacklist-cooldown-range", "300", "300",
                "-H", "tutti-h1:2,tutti-h2:2", ELASTIC_TRAINER, "--steps", "400",
                "--step-ms", "50"]
        proc = subprocess.Popen([TUTTIRUN] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env=job_env(TUTTI_TIMEOUT_SECONDS="4",
                                            TUTTI_START_TIMEOUT_SECONDS="20"))
        lines = []
        end = time.monotonic() + 60
        while time.monotonic() < end and not any("generation 0:" in l for l in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        time.sleep(3)  # the workers connect and train a little
        hosts("link", "tutti-h2", "down")
        try:
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                out, _ = proc.communicate()
            out = "".join(lines) + out
        finally:
            hosts("link", "tutti-h2", "up")
        self.assertEqual(proc.returncode, 0, out)
        self.assertRegex(out, r"ssh exited with code 255 .*; host tutti-h2 blacklisted", out)
        self.assertRegex(out, r"generation 1: 2 worker\(s\) \(w\d rank 0 on tutti-h1, "
                              r"w\d rank 1 on tutti-h1\)", out)
        self.assertEqual(out.count("of 2 (generation 1): step 400"), 2, out)
        self.assert_nothing_left(within=20)


def main():
    why = why_not_runnable()
    if why:
        print("multihost tests skipped: " + why)
        return SKIP_CODE
    setup = hosts("up", "3", check=False)
    print(setup.stdout, end="")
    if setup.returncode != 0:
        hosts("down", check=False)
        print("multihost tests skipped: simulated hosts could not be made")
        return SKIP_CODE
    try:
        program = unittest.main(module=__name__, argv=[sys.argv[0]] + sys.argv[1:],
                                exit=False, verbosity=2)
        return 0 if program.result.wasSuccessful() else 1
    finally:
        down = hosts("down", check=False)
        if down.returncode != 0:
            print(down.stdout)


if __name__ == "__main__":
    sys.exit(main())
