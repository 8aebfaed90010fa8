"""tuttirun --config-file reads horovodrun's YAML config file: every section and key sets what
the flag of the same name sets, a flag on the command line wins over the file, and the file
is read the same with PyYAML and without it (tuttirun's own reader of the mappings of
scalars these files hold), with errors that name the file, the line and what was expected."""
import os
import shutil
import subprocess
import tempfile
import unittest

from launcher_test_util import PYTHON, TUTTIRUN, run
from test_horovodrun_flags import dry_env, mpirun_argv
from tuttirun_lib import config_file

CONFIG = """\
# every key horovodrun 0.28.1 reads
controller: gloo
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: false
  hierarchical_allgather: true
  torus_allreduce: false
autotune:
  enabled: true
  log_file: 'tune.csv'   # a comment
  warmup_samples: 5
  steps_per_sample: 20
timeline:
  filename: "/tmp/timeline#1/"
  mark_cycles: yes
stall_check:
  enabled: false
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  num_nccl_streams: 2
  gloo_timeout_seconds: 60
logging:
  level: INFO
  with_timestamp: true
"""
EXPECTED = {
    "TUTTI_CPU_OPERATIONS": "gloo", "TUTTI_FUSION_THRESHOLD": str(32 << 20),
    "TUTTI_CYCLE_TIME_MS": "10", "TUTTI_CACHE_CAPACITY": "2048",
    "TUTTI_HIERARCHICAL_ALLREDUCE": "0", "TUTTI_HIERARCHICAL_ALLGATHER": "1",
    "TUTTI_AUTOTUNE": "1", "TUTTI_AUTOTUNE_LOG": "tune.csv",
    "TUTTI_AUTOTUNE_WARMUP_WINDOWS": "5", "TUTTI_TIMELINE": "/tmp/timeline#1/",
    "TUTTI_TIMELINE_MARK_CYCLES": "1", "TUTTI_STALL_CHECK_DISABLE": "1",
    "TUTTI_STALL_CHECK_TIME_SECONDS": "120", "TUTTI_STALL_SHUTDOWN_TIME_SECONDS": "240",
    "TUTTI_START_TIMEOUT_SECONDS": "60", "TUTTI_LOG_LEVEL": "info", "TUTTI_LOG_HIDE_TIME": "0",
}
# Runs tuttirun as if PyYAML were not installed.
NO_YAML = ("import runpy, sys; sys.modules['yaml'] = None; sys.argv[0] = %r; "
           "runpy.run_path(%r, run_name='__main__')")


def has_yaml():
    try:
        import yaml  # noqa: F401
        return True
    except ImportError:
        return False


class ConfigFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-config-")
        self.addCleanup(shutil.rmtree, self.dir)

    def write(self, text, name="horovod.yaml"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_without_yaml(self, args):
        return subprocess.run([PYTHON, "-c", NO_YAML % (TUTTIRUN, TUTTIRUN)] + args,
                              capture_output=True, text=True, timeout=60)

    def test_every_key_sets_its_variable_with_and_without_pyyaml(self):
        path = self.write(CONFIG)
        runs = [("stdlib reader", self.run_without_yaml)]
        if has_yaml():
            runs.append(("PyYAML", run))
        for how, runner in runs:
            with self.subTest(how=how):
                r = runner(["-np", "1", "--dry-run", "--config-file", path, "true"])
                self.assertEqual(r.returncode, 0, r.stderr)
                env = dry_env(r)
                self.assertEqual({k: env.get(k) for k in EXPECTED}, EXPECTED)
                # Keys Tutti has no use for get their one line, as the flags do.
                self.assertIn("tuttirun: note: --num-nccl-streams 2:", r.stderr)
                self.assertIn("tuttirun: note: --autotune-steps-per-sample 20:", r.stderr)
                self.assertNotIn("--torus-allreduce", r.stderr)  # false: nothing to say

    def test_reader_agrees_with_pyyaml(self):
        if not has_yaml():
            self.skipTest("PyYAML is not installed for %s" % PYTHON)
        import yaml
        text = CONFIG + "extra:\n  \"quoted key\": 'it''s # not a comment'\n  empty:\n" \
                        "  n: ~\n  f: -2.5\n  s: 1e5\n  b: On\n"
        self.assertEqual(config_file.parse_mappings(text, "f"), yaml.safe_load(text))

    def test_command_line_wins_and_controller(self):
        path = self.write("controller: mpi\nparams:\n  cycle_time_ms: 10\n"
                          "  hierarchical_allreduce: true\nstall_check:\n  enabled: false\n")
        r = run(["-np", "2", "--dry-run", "--config-file", path, "--cycle-time-ms", "3",
                 "--no-hierarchical-allreduce", "--stall-check", "prog"])
        self.assertEqual(r.returncode, 0, r.stderr)
        argv = mpirun_argv(r)  # controller: mpi
        self.assertIn("TUTTI_CYCLE_TIME_MS=3.0", argv)
        self.assertIn("TUTTI_HIERARCHICAL_ALLREDUCE=0", argv)
        self.assertFalse([a for a in argv if a.startswith("TUTTI_STALL_CHECK_DISABLE")])
        r = run(["-np", "2", "--dry-run", "--gloo", "--config-file", path, "true"])
        self.assertEqual(dry_env(r)["TUTTI_CPU_OPERATIONS"], "gloo")  # --gloo wins
        # horovodrun's own sample file writes logging.hide_timestamp: the inverse.
        path = self.write("logging:\n  hide_timestamp: true\n")
        r = run(["-np", "1", "--dry-run", "--config-file", path, "true"])
        self.assertEqual(dry_env(r)["TUTTI_LOG_HIDE_TIME"], "1")
        r = run(["-np", "1", "--dry-run", "--config-file", path, "--log-with-timestamp", "true"])
        self.assertEqual(dry_env(r)["TUTTI_LOG_HIDE_TIME"], "0")

    def test_errors_name_file_line_and_expectation(self):
        cases = [
            ("params:\n  cycle_time_ms: 1\n\tcache_capacity: 2\n", False,
             "line 3: expected indentation by spaces, got a tab"),
            ("params:\n  cycle_time_ms: [1, 2]\n", False,
             "line 2: expected a plain scalar (string, number, true/false), got '[1, 2]'"),
            ("params:\n  cycle_time_ms: 1\n   cache_capacity: 2\n", False,
             "line 3: expected the indentation of the keys around it (2 spaces), got 3"),
            ("params:\n  cycle_time_ms: fast\n", True,
             ": params.cycle_time_ms: expected a number, got 'fast'"),
            ("logging:\n  level: loud\n", True, ": logging.level: expected one of trace,"),
            ("controller: jsrun\n", True, ": controller: expected gloo or mpi, got 'jsrun'"),
            ("params:\n  cycle_time_ms: -1\n", True, "--cycle-time-ms -1: expected a value >= 0"),
        ]
        for text, any_reader, expected in cases:
            with self.subTest(text=text):
                path = self.write(text)
                r = self.run_without_yaml(["-np", "1", "--config-file", path, "true"])
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("tuttirun: error: ", r.stderr)
                self.assertIn(expected, r.stderr)
                if not any_reader:
                    self.assertIn("--config-file %s line" % path, r.stderr)
        r = run(["-np", "1", "--config-file", os.path.join(self.dir, "none.yaml"), "true"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("none.yaml: cannot read it: No such file or directory", r.stderr)

    def test_unknown_keys_are_named_and_ignored(self):
        path = self.write("params:\n  cycle_time_ms: 4\n  cylce_time: 9\nlogs:\n  x: 1\n")
        r = self.run_without_yaml(["-np", "1", "--dry-run", "--config-file", path, "true"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(dry_env(r)["TUTTI_CYCLE_TIME_MS"], "4")
        self.assertIn("unknown key 'params.cylce_time' (ignored)", r.stderr)
        self.assertIn("unknown section 'logs' (ignored)", r.stderr)


if __name__ == "__main__":
    unittest.main()
