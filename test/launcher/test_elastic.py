"""tuttirun's elastic driver (docs/elastic.md): discovery output, blacklist cool-downs, flag
checks, and the C++ elastic example (examples/cpp/elastic_trainer.cc) surviving a killed
worker. The PyTorch jobs are in test/python/test_torch_elastic.py."""
import os
import sys
import tempfile
import unittest

from launcher_test_util import run
from tuttirun_lib import elastic

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from exit_jobs import Job  # noqa: E402

TRAINER = os.environ.get("ELASTIC_TRAINER", "")


class ElasticDriverTest(unittest.TestCase):
    def test_discovery_lines(self):
        text = "# pool\nnode1:4\nnode2\n\nnode1:2\n"
        self.assertEqual(elastic.parse_discovery_output(text, 3, "s.sh"),
                         [("node1", 6), ("node2", 3)])
        with self.assertRaisesRegex(elastic.ElasticError, r"s.sh, line 1: slots must be"):
            elastic.parse_discovery_output("node1:x\n", 1, "s.sh")

    def test_discovery_script_failure_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "discover.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\necho broken >&2\nexit 3\n")
            os.chmod(script, 0o755)
            with self.assertRaisesRegex(elastic.ElasticError, r"exited with code 3: broken"):
                elastic.discover(script, 1, 10)

    def test_blacklist_cooldown_doubles_up_to_the_maximum(self):
        book = elastic.HostBook((10, 25))
        book.slots = {"a": 2, "b": 1}
        self.assertEqual(book.blacklist("a", 100.0), 10)
        self.assertFalse(book.usable("a", 105.0))
        self.assertTrue(book.usable("a", 110.0))
        self.assertEqual(book.blacklist("a", 110.0), 20)
        self.assertEqual(book.blacklist("a", 200.0), 25)
        self.assertTrue(book.usable("b", 0.0))
        self.assertFalse(book.usable("c", 0.0))  # not discovered

    def test_bad_elastic_flags(self):
        r = run(["-np", "2", "--min-np", "3", "true"], timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--min-np 3 is above -np 2", r.stderr)
        r = run(["-np", "2", "--max-np", "1", "--min-np", "2", "true"], timeout=30)
        self.assertIn("--max-np 1 is below --min-np 2", r.stderr)
        r = run(["-np", "2", "--host-discovery-script", "/nonexistent/discover.sh", "true"],
                timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--host-discovery-script /nonexistent/discover.sh cannot run", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        r = run(["-np", "3", "--min-np", "2", "--dry-run", "true"], timeout=30)
        self.assertIn("hosts now: localhost:3", r.stdout)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_cpp_trainer_survives_a_killed_worker(self):
        job = Job("gloo", 3, [TRAINER, "--steps", "120", "--die-at", "50"], limit=60,
                  tuttirun_args=["--min-np", "2", "--blacklist-cooldown-range", "60", "60"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 0, job.what)
        self.assertIn("killed by signal 9", job.output, job.what)
        self.assertIn("generation 1: 2 worker(s)", job.output, job.what)
        self.assertEqual(job.output.count("of 2 (generation 1): step 120"), 2, job.what)
        self.assertEqual(job.output.count("replicas agree"), 2, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_reset_limit_stops_the_job(self):
        job = Job("gloo", 3, [TRAINER, "--steps", "120", "--die-at", "50"], limit=60,
                  tuttirun_args=["--min-np", "2", "--reset-limit", "0"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 1, job.what)
        self.assertIn("reset limit reached: 0 generation(s) after the first (--reset-limit 0)",
                      job.output, job.what)


if __name__ == "__main__":
    unittest.main()
