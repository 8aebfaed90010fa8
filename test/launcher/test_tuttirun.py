"""tuttirun end to end: worker environment, hosts, exit codes, signals, teardown, output
forwarding, --output-filename, --mpi command construction, --check-build, ssh commands."""
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import unittest

from launcher_test_util import LIB_DIR, PYTHON, TUTTIRUN, alive, run
from tuttirun_lib import binding
from tuttirun_lib import hosts as hostlib
from tuttirun_lib.spawn import remote_command

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def lines_by_rank(text, stream="stdout"):
    out = {}
    for line in text.splitlines():
        m = PREFIX.match(line)
        if m and m.group(2) == stream:
            out.setdefault(int(m.group(1)), []).append(m.group(3))
    return out


def pids_in(text):
    return [int(p) for p in re.findall(r"pid (\d+) child (\d+)", text) for p in p]


class EnvironmentTest(unittest.TestCase):
    def test_worker_environment_and_flags(self):
        env = dict(os.environ, X_FROM_ENV="here")
        r = run(["-np", "3", "-x", "X_SET=value with space", "-x", "X_FROM_ENV",
                 "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5",
                 "--timeline-filename", "/tmp/tl.json", "--cache-capacity", "7",
                 "--stall-check-warning-time-seconds", "11",
                 "--stall-check-shutdown-time-seconds", "22", "--no-stall-check",
                 "--log-level", "debug", "--start-timeout", "33",
                 PYTHON, WORKER, "env"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {rank: json.loads(lines[0]) for rank, lines in lines_by_rank(r.stdout).items()}
        self.assertEqual(sorted(seen), [0, 1, 2])
        secrets = set()
        for rank, e in seen.items():
            self.assertEqual(e["TUTTI_RANK"], str(rank))
            self.assertEqual(e["TUTTI_SIZE"], "3")
            self.assertEqual((e["TUTTI_LOCAL_RANK"], e["TUTTI_LOCAL_SIZE"]), (str(rank), "3"))
            self.assertEqual((e["TUTTI_CROSS_RANK"], e["TUTTI_CROSS_SIZE"]), ("0", "1"))
            self.assertEqual(e["TUTTI_CPU_OPERATIONS"], "gloo")
            self.assertEqual(e["TUTTI_RENDEZVOUS_ADDR"], "127.0.0.1")
            self.assertTrue(1 <= int(e["TUTTI_RENDEZVOUS_PORT"]) <= 65535)
            self.assertRegex(e["TUTTI_SECRET"], r"^[0-9a-f]{64}$")
            self.assertFalse(e["secret_on_cmdline"])
            secrets.add(e["TUTTI_SECRET"])
            self.assertEqual(e["X_SET"], "value with space")
            self.assertEqual(e["X_FROM_ENV"], "here")
            self.assertEqual(e["TUTTI_FUSION_THRESHOLD"], str(2 * 1024 * 1024))
            self.assertEqual(e["TUTTI_CYCLE_TIME_MS"], "3.5")
            self.assertEqual(e["TUTTI_TIMELINE"], "/tmp/tl.json")
            self.assertEqual(e["TUTTI_CACHE_CAPACITY"], "7")
            self.assertEqual(e["TUTTI_STALL_CHECK_TIME_SECONDS"], "11.0")
            self.assertEqual(e["TUTTI_STALL_SHUTDOWN_TIME_SECONDS"], "22.0")
            self.assertEqual(e["TUTTI_STALL_CHECK_DISABLE"], "1")
            self.assertEqual(e["TUTTI_LOG_LEVEL"], "debug")
            self.assertEqual(e["TUTTI_START_TIMEOUT_SECONDS"], "33.0")
        self.assertEqual(len(secrets), 1)
        self.assertNotIn(secrets.pop(), r.stderr)

    def test_each_job_has_its_own_secret(self):
        a = run(["-np", "1", PYTHON, WORKER, "env"])
        b = run(["-np", "1", PYTHON, WORKER, "env"])
        sa = json.loads(lines_by_rank(a.stdout)[0][0])["TUTTI_SECRET"]
        sb = json.loads(lines_by_rank(b.stdout)[0][0])["TUTTI_SECRET"]
        self.assertNotEqual(sa, sb)

    def test_hosts_place_local_and_cross_ranks(self):
        r = run(["-np", "4", "-H", "localhost:2,127.0.0.1:2", PYTHON, WORKER, "env"])
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {k: json.loads(v[0]) for k, v in lines_by_rank(r.stdout).items()}
        got = [(seen[k]["TUTTI_LOCAL_RANK"], seen[k]["TUTTI_LOCAL_SIZE"],
                seen[k]["TUTTI_CROSS_RANK"], seen[k]["TUTTI_CROSS_SIZE"]) for k in range(4)]
        self.assertEqual(got, [("0", "2", "0", "2"), ("1", "2", "0", "2"),
                               ("0", "2", "1", "2"), ("1", "2", "1", "2")])

    def test_hostfile_end_to_end(self):
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write("# two local names\nlocalhost slots=1\n127.0.0.1 slots=2\n")
        try:
            r = run(["-np", "3", "--hostfile", f.name, PYTHON, WORKER, "env"])
        finally:
            os.unlink(f.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {k: json.loads(v[0]) for k, v in lines_by_rank(r.stdout).items()}
        self.assertEqual([(seen[k]["TUTTI_LOCAL_RANK"], seen[k]["TUTTI_LOCAL_SIZE"])
                          for k in range(3)], [("0", "1"), ("0", "2"), ("1", "2")])

    def test_too_few_slots_and_bad_arguments(self):
        r = run(["-np", "5", "-H", "localhost:2,127.0.0.1:2", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("more processes than the hosts have slots (4", r.stderr)
        self.assertNotEqual(run(["true"]).returncode, 0)  # no -np
        self.assertEqual(run(["-np", "1", "-x", "TUTTI_SECRET=abc", "true"]).returncode, 2)
        r = run(["-np", "1", "/nonexistent/program"])
        self.assertEqual(r.returncode, 127)
        self.assertIn("cannot start rank 0", r.stderr)


class HostParsingTest(unittest.TestCase):
    def test_host_list(self):
        self.assertEqual(hostlib.parse_hosts("a:2,b:3,c"), [("a", 2), ("b", 3), ("c", 1)])
        for bad in ("a:0", "a:x", ",", "a:-1"):
            with self.assertRaises(hostlib.HostError):
                hostlib.parse_hosts(bad)

    def test_hostfile(self):
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write("# cluster\nnode1 slots=4\n\nnode2 slots=2 max_slots=8  # spare\n"
                    "node3:3\nnode4\n")
        try:
            self.assertEqual(hostlib.parse_hostfile(f.name),
                             [("node1", 4), ("node2", 2), ("node3", 3), ("node4", 1)])
            with open(f.name, "w") as g:
                g.write("node1 slots=four\n")
            with self.assertRaisesRegex(hostlib.HostError, r":1: slots must be"):
                hostlib.parse_hostfile(f.name)
            with open(f.name, "w") as g:
                g.write("node1 cpus=4\n")
            with self.assertRaisesRegex(hostlib.HostError, "unexpected 'cpus=4'"):
                hostlib.parse_hostfile(f.name)
        finally:
            os.unlink(f.name)

    def test_repeated_hosts_add_up(self):
        # -H h1:1,h2:1,h1:1 and a PBS/SGE nodefile naming each host once per slot
        self.assertEqual(hostlib.parse_hosts("h1:1,h2:1,h1:1"), [("h1", 2), ("h2", 1)])
        with tempfile.NamedTemporaryFile("w", suffix=".nodes", delete=False) as f:
            f.write("h1\nh1\nh2\n# spare\n\nh2\n")
        try:
            hosts = hostlib.parse_hostfile(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(hosts, [("h1", 2), ("h2", 2)])
        self.assertEqual([(s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
                          for s in hostlib.place(hosts, 4)],
                         [("h1", 0, 2, 0, 2), ("h1", 1, 2, 0, 2), ("h2", 0, 2, 1, 2),
                          ("h2", 1, 2, 1, 2)])

    def test_placement_with_uneven_hosts(self):
        slots = hostlib.place([("a", 3), ("b", 1), ("c", 2)], 5)
        self.assertEqual([(s.rank, s.host, s.local_rank, s.local_size, s.cross_rank,
                           s.cross_size) for s in slots],
                         [(0, "a", 0, 3, 0, 3), (1, "a", 1, 3, 0, 1), (2, "a", 2, 3, 0, 1),
                          (3, "b", 0, 1, 1, 3), (4, "c", 0, 1, 2, 3)])

    def test_local_host_detection(self):
        import socket
        for host in ("localhost", "127.0.0.1", "127.0.0.2", socket.gethostname()):
            self.assertTrue(hostlib.is_local(host), host)
        self.assertFalse(hostlib.is_local("203.0.113.7"))  # TEST-NET-3, never ours

    def test_remote_command_keeps_the_secret_off_the_command_line(self):
        secret = "ab" * 32
        argv, stdin = remote_command("node7", [PYTHON, "train.py", "--lr", "0.1 x"],
                                     {"TUTTI_RANK": "3", "X": "a b"}, "/work dir", secret,
                                     ssh_port=2222, ssh_identity="/keys/id", connect_timeout=9)
        self.assertNotIn(secret, " ".join(argv))
        self.assertEqual(stdin, (secret + "\n").encode())
        self.assertEqual(argv[:5], ["ssh", "-o", "BatchMode=yes", "-o",
                                    "StrictHostKeyChecking=accept-new"])
        self.assertIn("ConnectTimeout=9", argv)
        self.assertEqual(argv[argv.index("-p") + 1], "2222")
        self.assertEqual(argv[argv.index("-i") + 1], "/keys/id")
        self.assertEqual(argv[-2], "node7")
        script = shlex.split(argv[-1])[2]  # sh -c SCRIPT
        self.assertIn("read -r TUTTI_SECRET", script)
        self.assertIn("TUTTI_RANK=3", script)
        self.assertIn("'X=a b'", script)
        self.assertIn("'0.1 x'", script)
        self.assertIn("cd '/work dir'", script)
        # The script itself works: run it with sh locally, secret on stdin, which stays open
        # while the worker runs (closing it is how tuttirun stops a remote worker).
        proc = subprocess.Popen(["sh", "-c", script.replace("cd '/work dir'", "cd /").replace(
            shlex.quote(PYTHON) + " train.py --lr '0.1 x'",
            "sh -c 'echo $TUTTI_SECRET $TUTTI_RANK'")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        proc.stdin.write(stdin)
        proc.stdin.flush()
        out = proc.stdout.read()
        proc.stdin.close()
        proc.stdout.close()
        self.assertEqual(proc.wait(timeout=30), 0)
        self.assertEqual(out.decode().split(), [secret, "3"])


class TeardownTest(unittest.TestCase):
    def start(self, args):
        return subprocess.Popen([PYTHON, TUTTIRUN] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def wait_for_pids(self, proc, count):
        pids, deadline = [], time.monotonic() + 30
        while len(pids) < 2 * count and time.monotonic() < deadline:
            line = proc.stdout.readline()
            pids += pids_in(line)
        self.assertEqual(len(pids), 2 * count, "workers did not start")
        return pids

    def assert_all_dead(self, pids):
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in pids if alive(p)], [])

    def test_exit_code_of_the_first_failed_rank(self):
        start = time.monotonic()
        r = run(["-np", "3", PYTHON, WORKER, "fail", "1", "3"])
        self.assertEqual(r.returncode, 3)
        self.assertRegex(r.stderr, r"tuttirun: rank 1 \(pid \d+ on localhost\) exited with "
                                   r"code 3; stopping the other 2 worker\(s\)")
        self.assertLess(time.monotonic() - start, 20)
        self.assert_all_dead(pids_in(r.stdout))

    def test_killed_worker(self):
        r = run(["-np", "3", PYTHON, WORKER, "kill", "2"])
        self.assertEqual(r.returncode, 128 + 9)
        self.assertRegex(r.stderr, r"rank 2 \(pid \d+ on localhost\) killed by signal 9")
        self.assert_all_dead(pids_in(r.stdout))

    def test_ctrl_c_stops_every_worker_and_child(self):
        proc = self.start(["-np", "3", PYTHON, WORKER, "sleep"])
        pids = self.wait_for_pids(proc, 3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        self.assertIn("received SIGINT", err)
        self.assert_all_dead(pids)

    def test_workers_die_with_a_killed_tuttirun(self):
        proc = self.start(["-np", "2", PYTHON, WORKER, "sleep"])
        pids = self.wait_for_pids(proc, 2)
        proc.kill()  # SIGKILL: no teardown runs; PR_SET_PDEATHSIG kills the workers
        proc.communicate(timeout=30)
        self.assert_all_dead(pids[0::2])  # the workers; their children are orphaned sleeps
        for child in pids[1::2]:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def test_sigterm_and_a_worker_that_ignores_it(self):
        proc = self.start(["-np", "2", PYTHON, WORKER, "sleep", "ignore-term"])
        pids = self.wait_for_pids(proc, 2)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM)
        self.assertLess(time.monotonic() - start, 15)  # grace period, then SIGKILL
        self.assert_all_dead(pids)


class OutputTest(unittest.TestCase):
    def test_prefixed_whole_lines(self):
        n = 1500
        r = run(["-np", "4", PYTHON, WORKER, "spam", str(n)], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        out = lines_by_rank(r.stdout)
        for rank in range(4):
            lines = out[rank]
            self.assertEqual(len(lines), n + 1)
            for i, line in enumerate(lines[:n]):
                self.assertEqual(line, "line-%d-%d-%s" % (rank, i, "x" * (200 + (i * 37) % 3000)))
            self.assertEqual(lines[n], "last-%d-without-newline" % rank)
            self.assertEqual(len(lines_by_rank(r.stderr, "stderr")[rank]), (n + 9) // 10)
        for line in r.stdout.splitlines():  # nothing unprefixed, nothing spliced
            self.assertRegex(line, r"^\[\d\]<stdout>:(line-\d+-\d+-x+|last-\d-without-newline)$")

    def test_output_filename(self):
        with tempfile.TemporaryDirectory() as d:
            r = run(["-np", "2", "--output-filename", d, PYTHON, WORKER, "spam", "20"])
            self.assertEqual(r.returncode, 0, r.stderr)
            for rank in range(2):
                with open(os.path.join(d, "rank.%d" % rank, "stdout")) as f:
                    lines = f.read().splitlines()
                self.assertEqual(lines[0], "line-%d-0-%s" % (rank, "x" * 200))
                self.assertEqual(lines[-1], "last-%d-without-newline" % rank)
                with open(os.path.join(d, "rank.%d" % rank, "stderr")) as f:
                    self.assertEqual(f.read().split(), ["err-%d-%d" % (rank, i)
                                                        for i in (0, 10)])


FAKE_SSH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_ssh")


class RemoteTest(unittest.TestCase):
    """Remote hosts through fake_ssh/ssh, which runs the remote command here with a clean
    environment in its own session, as sshd would."""

    def setUp(self):
        self.log = tempfile.NamedTemporaryFile(delete=False)
        self.log.close()
        self.env = dict(os.environ, PATH=FAKE_SSH_DIR + os.pathsep + os.environ["PATH"],
                        FAKE_SSH_LOG=self.log.name, X_FOLLOWS="1", X_PASSED="yes",
                        SSH_X_HOST_SPECIFIC="1")
        self.hosts = ["-H", "fakehost-a:2,fakehost-b:1", "--network-interface", "lo"]

    def tearDown(self):
        os.unlink(self.log.name)

    def test_remote_environment_and_secret_via_stdin(self):
        r = run(self.hosts + ["-np", "3", "-x", "X_PASSED", "--ssh-port", "2222", PYTHON,
                              WORKER, "env"], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {k: json.loads(v[0]) for k, v in lines_by_rank(r.stdout).items()}
        self.assertEqual(sorted(seen), [0, 1, 2])
        secret = seen[0]["TUTTI_SECRET"]
        self.assertRegex(secret, r"^[0-9a-f]{64}$")
        for rank, e in seen.items():
            self.assertEqual(e["TUTTI_RANK"], str(rank))
            self.assertEqual(e["TUTTI_SECRET"], secret)
            self.assertEqual(e["TUTTI_RENDEZVOUS_ADDR"], "127.0.0.1")
            self.assertEqual(e["TUTTI_GLOO_IFACE"], "lo")
            self.assertEqual(e["X_PASSED"], "yes")
            # The launching environment follows the ranks (as with horovodrun); fake_ssh
            # starts the remote side clean, so this came through the remote command.
            self.assertEqual(e["X_FOLLOWS"], "1")
            self.assertFalse(e["secret_on_cmdline"])
        self.assertEqual([e["TUTTI_LOCAL_RANK"] for _, e in sorted(seen.items())],
                         ["0", "1", "0"])
        with open(self.log.name) as f:
            ssh_lines = f.read().splitlines()
        self.assertEqual(len(ssh_lines), 3)
        for line in ssh_lines:
            self.assertNotIn(secret, line)
            self.assertIn("-p 2222", line)
            self.assertIn("TUTTI_RANK=", line)
            self.assertNotIn("SSH_X_HOST_SPECIFIC", line)  # host-specific: stays here

    def test_remote_failure_and_teardown(self):
        r = run(self.hosts + ["-np", "3", PYTHON, WORKER, "fail", "2", "4"], env=self.env)
        self.assertEqual(r.returncode, 4)
        # The pid is the worker's own, on its host (its script reports it), not ssh's here.
        pid = int(re.search(r"failing pid (\d+)", r.stdout).group(1))
        self.assertIn("rank 2 (pid %d on fakehost-b) exited with code 4" % pid, r.stderr)
        self.assertNotIn("TUTTIRUN_REMOTE_PID", r.stdout + r.stderr)
        TeardownTest.assert_all_dead(self, pids_in(r.stdout))

    def test_ctrl_c_stops_remote_workers(self):
        proc = subprocess.Popen([PYTHON, TUTTIRUN] + self.hosts + ["-np", "3", PYTHON,
                                                                   WORKER, "sleep"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env)
        pids = TeardownTest.wait_for_pids(self, proc, 3)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        TeardownTest.assert_all_dead(self, pids)


def allowed_cpus(text):
    """{rank: set of CPUs} from workers that printed their Cpus_allowed_list."""
    found = {}
    for rank, line in lines_by_rank(text).items():
        for entry in line[-1].split(":", 1)[1].strip().split(","):
            first, _, last = entry.partition("-")
            found.setdefault(rank, set()).update(range(int(first), int(last or first) + 1))
    return found


class BindingTest(unittest.TestCase):
    """--bind-to: the CPUs each local worker may run on."""
    SHOW = ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]

    def fake_sysfs(self, d, topology):
        """topology: {cpu: (package, core)}"""
        for cpu, (package, core) in topology.items():
            base = os.path.join(d, "cpu%d" % cpu, "topology")
            os.makedirs(base)
            with open(os.path.join(base, "physical_package_id"), "w") as f:
                f.write("%d\n" % package)
            with open(os.path.join(base, "core_id"), "w") as f:
                f.write("%d\n" % core)

    def test_cores_packages_and_hardware_threads(self):
        # 2 packages x 2 cores x 2 hardware threads; CPU n and n+4 share a core.
        topology = {cpu: (cpu % 4 // 2, cpu % 2) for cpu in range(8)}
        with tempfile.TemporaryDirectory() as d:
            self.fake_sysfs(d, topology)
            cores = binding.host_cores(range(8), sysfs=d)
            self.assertEqual(cores, [(0, [0, 4]), (0, [1, 5]), (1, [2, 6]), (1, [3, 7])])
            # only the CPUs tuttirun may use count
            self.assertEqual(binding.host_cores([1, 2, 5], sysfs=d), [(0, [1, 5]), (1, [2])])
        self.assertEqual(binding.cpus_for("core", 0, 4, cores), [0, 4])
        self.assertEqual(binding.cpus_for("core", 3, 4, cores), [3, 7])
        self.assertEqual(binding.cpus_for("package", 2, 4, cores), [2, 3, 6, 7])
        self.assertIsNone(binding.cpus_for("none", 0, 4, cores))
        self.assertEqual(binding.cpus_for("auto", 1, 4, cores), [1, 5])
        self.assertIsNone(binding.cpus_for("auto", 1, 5, cores))  # more ranks than cores
        self.assertEqual(binding.cpus_for("core", 4, 5, cores), [0, 4])  # wraps around
        self.assertEqual(binding.describe([0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11")

    def test_unreadable_topology_counts_each_cpu_as_a_core(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(binding.host_cores([0, 3], sysfs=d), [(0, [0]), (0, [3])])

    def test_workers_run_on_their_cpus(self):
        cores = binding.host_cores()
        np = min(2, len(cores))
        r = run(["-np", str(np), "--bind-to", "core"] + self.SHOW)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = allowed_cpus(r.stdout)
        for rank in range(np):
            self.assertEqual(got[rank], set(cores[rank][1]), r.stdout)
        mine = set(os.sched_getaffinity(0))
        clean = {k: v for k, v in os.environ.items() if k != binding.ENV}
        for flag, env in (([], dict(clean, TUTTI_BIND_TO="none")), (["--bind-to", "none"], clean)):
            r = run(["-np", "2"] + flag + self.SHOW, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(allowed_cpus(r.stdout), {0: mine, 1: mine}, flag)
        # The default is auto: a core each where there are enough, else not bound.
        r = run(["-np", "2"] + self.SHOW, env=clean)
        self.assertEqual(r.returncode, 0, r.stderr)
        expected = {rank: set(binding.cpus_for("auto", rank, 2, cores) or mine) for rank in (0, 1)}
        self.assertEqual(allowed_cpus(r.stdout), expected)
        r = run(["-np", "1"] + self.SHOW, env=dict(clean, TUTTI_BIND_TO="everywhere"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("TUTTI_BIND_TO='everywhere': expected one of none, core, package, auto",
                      r.stderr)

    def test_default_binding_is_auto_unless_the_environment_says(self):
        self.assertEqual(binding.default({}), "auto")
        self.assertEqual(binding.default({"TUTTI_BIND_TO": ""}), "auto")
        self.assertEqual(binding.default({"TUTTI_BIND_TO": "none"}), "none")
        with self.assertRaises(ValueError):
            binding.default({"TUTTI_BIND_TO": "socket"})

    def test_dry_run_names_the_cpus_and_mpi_gets_the_binding(self):
        r = run(["-np", "1", "--bind-to", "core", "--dry-run", "prog"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(local, CPUs %s)" % binding.describe(binding.host_cores()[0][1]),
                      r.stdout)
        auto = binding.resolve("auto", 1, binding.host_cores())
        clean = {k: v for k, v in os.environ.items() if k != binding.ENV}
        for flag, env, expected in ((["--bind-to", "package"], clean, "--bind-to package"),
                                    (["--bind-to", "auto"], clean, "--bind-to " + auto),
                                    ([], dict(clean, TUTTI_BIND_TO="none"), "--bind-to none")):
            r = run(["--mpi", "--dry-run", "-np", "1"] + flag + ["prog"], env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(expected, r.stdout)
        # By default mpirun binds as it does on its own: no --bind-to from tuttirun.
        r = run(["--mpi", "--dry-run", "-np", "1", "prog"], env=clean)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("--bind-to", r.stdout)
        r = run(["--mpi", "--dry-run", "-np", "1", "--bind-to", "core",
                 "--binding-args=--bind-to socket", "prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--bind-to and --binding-args", r.stderr)
        r = run(["-np", "1", "--bind-to", "everywhere", "prog"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--bind-to", r.stderr)


class MpiAndBuildTest(unittest.TestCase):
    def test_mpirun_command(self):
        r = run(["--mpi", "--dry-run", "-np", "4", "-H", "a:2,b:2", "-x", "X_A=1",
                 "--fusion-threshold-mb", "1", "--output-filename", "/tmp/out",
                 "prog", "--flag"])
        self.assertEqual(r.returncode, 0, r.stderr)
        argv = shlex.split(r.stdout.strip()[len("tuttirun: "):])
        self.assertEqual(argv[:5], ["mpirun", "-np", "4", "-H", "a:2,b:2"])
        self.assertNotIn("--oversubscribe", argv)  # 4 slots listed
        self.assertEqual("--allow-run-as-root" in argv, os.geteuid() == 0)
        for pair in ("TUTTI_CPU_OPERATIONS=mpi", "X_A=1", "TUTTI_FUSION_THRESHOLD=1048576"):
            self.assertEqual(argv[argv.index(pair) - 1], "-x")
        self.assertEqual(argv[argv.index("--output-filename") + 1], "/tmp/out")
        self.assertEqual(argv[-2:], ["prog", "--flag"])
        self.assertFalse(any("SECRET" in a for a in argv))
        many = (os.cpu_count() or 1) + 1
        r = run(["--mpi", "--dry-run", "-np", str(many), "prog"])
        self.assertIn("--oversubscribe", r.stdout)

    @unittest.skipUnless(subprocess.run(["sh", "-c", "command -v mpirun"],
                                        capture_output=True).returncode == 0, "no mpirun")
    def test_mpirun_runs_with_verbose(self):
        r = run(["--mpi", "--verbose", "-np", "2", "sh", "-c",
                 "echo rank=$OMPI_COMM_WORLD_RANK ops=$TUTTI_CPU_OPERATIONS"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"tuttirun: mpirun -np 2 ")
        self.assertIn("rank=0 ops=mpi", r.stdout)
        self.assertIn("rank=1 ops=mpi", r.stdout)

    def test_check_build(self):
        r = run(["--check-build"])
        self.assertEqual(r.returncode, 0, r.stderr)
        info_path = os.path.join(LIB_DIR, "tuttirun_lib", "build_info.json")
        with open(info_path) as f:
            info = json.load(f)
        for section in ("Available Frameworks:", "Available Controllers:",
                        "Available Tensor Operations:"):
            self.assertIn(section, r.stdout)
        mark = "[X]" if info["gloo"] else "[ ]"
        self.assertIn("%s Gloo" % mark, r.stdout)
        self.assertIn("Tutti v%s" % info["version"], r.stdout)


if __name__ == "__main__":
    unittest.main()
