"""tuttirun takes horovodrun's command line: every flag of horovodrun 0.28.1 either works or
is accepted with one line saying what Tutti does instead (never argparse's "unrecognized
arguments", never a stop); docs/launcher.md lists them all. Also:
the MPI command line for --mpi-args, --tcp, --binding-args and network interfaces, and an
unresolvable host named in the error."""
import os
import re
import shlex
import tempfile
import unittest

from launcher_test_util import PYTHON, run
from tuttirun_lib import cli, compat

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
FAKE_SSH_DIR = os.path.join(HERE, "fake_ssh")
DOCS = os.path.join(HERE, "..", "..", "docs", "launcher.md")

# horovodrun 0.28.1's flags (horovod/runner/launch.py): all 71 spellings, short and long.
HOROVODRUN_FLAGS = """
-v --version -np --num-proc -cb --check-build --disable-cache --start-timeout
--network-interfaces --network-interface --output-filename --verbose --config-file
-p --ssh-port -i --ssh-identity-file --fusion-threshold-mb --cycle-time-ms --cache-capacity
--hierarchical-allreduce --no-hierarchical-allreduce --hierarchical-allgather
--no-hierarchical-allgather --torus-allreduce --no-torus-allreduce
--autotune --no-autotune --autotune-log-file --autotune-warmup-samples
--autotune-steps-per-sample --autotune-bayes-opt-max-samples --autotune-gaussian-process-noise
--min-np --min-num-proc --max-np --max-num-proc --slots-per-host --elastic-timeout
--reset-limit --blacklist-cooldown-range --timeline-filename --timeline-mark-cycles
--no-timeline-mark-cycles --no-stall-check --stall-check --stall-check-warning-time-seconds
--stall-check-shutdown-time-seconds --mpi-threads-disable --no-mpi-threads-disable
--mpi-args --tcp --binding-args --num-nccl-streams --thread-affinity --gloo-timeout-seconds
--log-level --log-with-timestamp --log-without-timestamp -prefix-timestamp
--prefix-output-with-timestamp --log-hide-timestamp --no-log-hide-timestamp
-H --hosts -hostfile --hostfile --host-discovery-script --gloo --mpi --jsrun
""".split()
ASCTIME = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"  # time.asctime(), as horovodrun


def dry_env(r):
    """TUTTI_*=... pairs of a --dry-run plan line for rank 0."""
    line = next(l for l in r.stdout.splitlines() if l.startswith("tuttirun: rank 0"))
    return dict(kv.split("=", 1) for kv in line.split(": ", 2)[2].split())


def mpirun_argv(r):
    return shlex.split(r.stdout.strip().splitlines()[-1][len("tuttirun: "):])


class HorovodrunFlagsTest(unittest.TestCase):
    def test_every_horovodrun_flag_is_known_and_documented(self):
        known = set(cli.make_parser()._option_string_actions)
        with open(DOCS) as f:
            docs = f.read()
        self.assertEqual(len(set(HOROVODRUN_FLAGS)), 71)
        for flag in HOROVODRUN_FLAGS:
            with self.subTest(flag=flag):
                self.assertIn(flag, known)
                self.assertTrue(re.search(r"`%s[` ]" % re.escape(flag), docs),
                                "%s is not in docs/launcher.md" % flag)

    def test_version_and_short_forms(self):
        for flag in ("-v", "--version"):
            r = run([flag])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"^tuttirun \(Tutti\) \d+\.\d+")
        r = run(["-cb"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Available Controllers:", r.stdout)
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("localhost slots=2\n")
        try:
            r = run(["-np", "2", "-hostfile", f.name, "--dry-run", "true"])
            self.assertEqual(r.returncode, 0, r.stderr)
            # "(local)", or "(local, CPUs ...)" where the default binding binds them
            self.assertEqual(r.stdout.count("on localhost (local"), 2)
        finally:
            os.unlink(f.name)
        # -p and -i reach ssh (the stand-in logs its arguments).
        with tempfile.NamedTemporaryFile(delete=False) as log:
            pass
        try:
            env = dict(os.environ, PATH=FAKE_SSH_DIR + os.pathsep + os.environ["PATH"],
                       FAKE_SSH_LOG=log.name)
            r = run(["-np", "1", "-H", "fakehost-a:1", "--network-interface", "lo",
                     "-p", "2222", "-i", "/keys/id", PYTHON, WORKER, "env"], env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(log.name) as f:
                ssh = f.read()
            self.assertIn("-p 2222", ssh)
            self.assertIn("-i /keys/id", ssh)
            self.assertIn("ServerAliveInterval=", ssh)
        finally:
            os.unlink(log.name)

    def test_settings_horovodrun_style(self):
        r = run(["-np", "1", "--dry-run", "--log-level", "INFO", "--gloo-timeout-seconds",
                 "45", "--nics", "lo", "true"])
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dry_env(r)
        self.assertEqual(env["TUTTI_LOG_LEVEL"], "info")
        self.assertEqual(env["TUTTI_START_TIMEOUT_SECONDS"], "45.0")
        self.assertEqual(env["TUTTI_GLOO_IFACE"], "lo")
        r = run(["-np", "1", "--dry-run", "--start-timeout", "60", "--gloo-timeout-seconds",
                 "45", "--log-level", "Debug", "true"])
        self.assertEqual(dry_env(r)["TUTTI_START_TIMEOUT_SECONDS"], "60.0")  # the larger
        self.assertEqual(dry_env(r)["TUTTI_LOG_LEVEL"], "debug")
        for flag, var, value in (("--hierarchical-allreduce", "ALLREDUCE", "1"),
                                 ("--no-hierarchical-allreduce", "ALLREDUCE", "0"),
                                 ("--hierarchical-allgather", "ALLGATHER", "1"),
                                 ("--no-hierarchical-allgather", "ALLGATHER", "0")):
            r = run(["-np", "1", "--dry-run", flag, "true"])
            self.assertEqual(dry_env(r)["TUTTI_HIERARCHICAL_" + var], value)
        r = run(["-np", "1", "--dry-run", "--log-level", "LOUD", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("invalid choice", r.stderr)

    def test_flags_asking_for_nothing_new_are_accepted(self):
        for flags, _dest in compat.OPPOSITES:
            with self.subTest(flag=flags[0]):
                r = run(["-np", "1", "--dry-run"] + flags + ["true"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stderr, "")
        r = run(["-np", "1", "--torus-allreduce", "--no-torus-allreduce", "true"])
        self.assertEqual(r.returncode, 2)  # as horovodrun: one or the other
        self.assertIn("not allowed with argument", r.stderr)
        r = run(["-np", "1", "--dry-run", "--stall-check", "--tcp", "true"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("TUTTI_STALL_CHECK_DISABLE", r.stdout)
        self.assertEqual(dry_env(r)["NCCL_IB_DISABLE"], "1")  # --tcp: NCCL too, as horovodrun
        r = run(["-np", "1", "--dry-run", "--mpi-args=--map-by node", "true"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--mpi-args applies to --mpi only; ignored", r.stderr)

    def test_ignored_flags_say_in_one_line_what_tutti_does_instead(self):
        for flags, _dest, kind, what in compat.IGNORED:
            with self.subTest(flag=flags[0]):
                value = {None: [], int: ["3"], float: ["0.5"]}[kind]
                r = run(["-np", "2", "--dry-run"] + flags + value + ["true"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stderr, "tuttirun: note: %s: %s\n" % (
                    " ".join(flags + value), what))
                self.assertNotRegex(r.stderr, r"(?i)issue|not supported")
        r = run(["-np", "2", "--num-nccl-streams", "two", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--num-nccl-streams: invalid int value: 'two'", r.stderr)
        r = run(["-np", "2", "--autotune-gaussian-process-noise", "1.5", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--autotune-gaussian-process-noise 1.5: expected a value in [0, 1]",
                      r.stderr)
        r = run(["-np", "2", "--jsrun", "--dry-run", "prog"])  # runs as --mpi
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tuttirun: note: --jsrun: %s\n" % compat.JSRUN_NOTICE, r.stderr)
        self.assertEqual(mpirun_argv(r)[0], "mpirun")
        r = run(["-np", "2", "--jsrun", "--gloo", "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("not allowed with argument", r.stderr)

    def test_autotune_timeline_and_log_flags_set_their_variables(self):
        cases = [
            (["--autotune"], "TUTTI_AUTOTUNE", "1"),
            (["--no-autotune"], "TUTTI_AUTOTUNE", "0"),
            (["--autotune-warmup-samples", "7"], "TUTTI_AUTOTUNE_WARMUP_WINDOWS", "7"),
            (["--timeline-mark-cycles"], "TUTTI_TIMELINE_MARK_CYCLES", "1"),
            (["--no-timeline-mark-cycles"], "TUTTI_TIMELINE_MARK_CYCLES", "0"),
            (["--log-with-timestamp"], "TUTTI_LOG_HIDE_TIME", "0"),
            (["--no-log-hide-timestamp"], "TUTTI_LOG_HIDE_TIME", "0"),
            (["--log-without-timestamp"], "TUTTI_LOG_HIDE_TIME", "1"),
            (["--log-hide-timestamp"], "TUTTI_LOG_HIDE_TIME", "1"),
        ]
        for flags, var, value in cases:
            with self.subTest(flags=flags):
                r = run(["-np", "1", "--dry-run"] + flags + ["true"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(dry_env(r)[var], value)
                self.assertIn(var, dry_env(r)["TUTTI_LAUNCHER_SETTINGS"].split(","))
        r = run(["-np", "1", "--dry-run", "true"])
        self.assertNotIn("TUTTI_LOG_HIDE_TIME", r.stdout)  # the library's default
        r = run(["-np", "1", "--log-with-timestamp", "--log-without-timestamp", "true"])
        self.assertEqual(r.returncode, 2)

    def test_prefix_output_with_timestamp(self):
        for flag in ("-prefix-timestamp", "--prefix-output-with-timestamp"):
            with self.subTest(flag=flag):
                r = run(["-np", "2", flag, PYTHON, "-c",
                         "import sys; print('out'); print('err', file=sys.stderr)"])
                self.assertEqual(r.returncode, 0, r.stderr)
                for rank in (0, 1):
                    self.assertRegex(r.stdout, r"(?m)^%s\[%d\]<stdout>:out$" % (ASCTIME, rank))
                    self.assertRegex(r.stderr, r"(?m)^%s\[%d\]<stderr>:err$" % (ASCTIME, rank))
        r = run(["-np", "1", PYTHON, "-c", "print('out')"])
        self.assertEqual(r.stdout, "[0]<stdout>:out\n")

    def test_mpi_command_line(self):
        r = run(["--mpi", "--dry-run", "-np", "4", "-H", "a:2,b:2", "--tcp",
                 "--network-interface", "eth1", "--network-interface", "eth2",
                 "--binding-args=--bind-to core", "--mpi-args=--map-by ppr:2:node "
                 "--mca oob_tcp_keepalive_time 60", "prog"])
        self.assertEqual(r.returncode, 0, r.stderr)
        argv = mpirun_argv(r)
        mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
        self.assertEqual(mca["btl_tcp_if_include"], "eth1,eth2")
        self.assertEqual(mca["oob_tcp_if_include"], "eth1,eth2")
        self.assertEqual((mca["pml"], mca["btl"]), ("ob1", "tcp,self"))
        self.assertEqual(mca["oob_tcp_keepalive_time"], "60")  # the user's value wins
        self.assertEqual(argv.count("oob_tcp_keepalive_time"), 1)
        self.assertEqual(mca["oob_tcp_keepalive_probes"], "5")  # remote hosts: keepalive on
        self.assertIn("--bind-to core", " ".join(argv))
        self.assertNotIn("none", argv)
        self.assertIn("NCCL_SOCKET_IFNAME=eth1,eth2", argv)
        self.assertEqual(argv[-1], "prog")
        self.assertLess(argv.index("--map-by"), argv.index("prog"))
        r = run(["--mpi", "--dry-run", "-np", "2", "--nics", "lo", "prog"])
        argv = mpirun_argv(r)
        self.assertIn("btl_tcp_if_include", argv)
        self.assertNotIn("oob_tcp_keepalive_time", argv)  # one host, this one

    def test_unresolvable_host_is_named(self):
        r = run(["-np", "2", "-H", "localhost:1,tutti-no-such-host:1", "true"], timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertRegex(r.stderr, r"host 'tutti-no-such-host': cannot resolve its name \(.+\)")
        self.assertNotIn("Errno", r.stderr)


if __name__ == "__main__":
    unittest.main()
