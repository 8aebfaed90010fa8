"""tuttirun's elastic driver (docs/elastic.md): discovery output, blacklist cool-downs, flag
checks, and the C++ elastic example (examples/cpp/elastic_trainer.cc) in each way a job
ends: finished after a killed worker, finished while a replacement was starting, the reset
limit, and tuttirun killed by SIGKILL (mid-training and while the workers wait for a world);
and horovodrun's semantics (HorovodSemanticsTest).
The PyTorch jobs are in test/python/test_torch_elastic.py."""
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

from launcher_test_util import PYTHON, TUTTIRUN, run
from tuttirun_lib import elastic

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from exit_jobs import Job, job_processes  # noqa: E402

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
        book = elastic.HostBook((10, 45))
        book.slots = {"a": 2, "b": 1}
        self.assertEqual(book.blacklist("a", 100.0), 20)  # 2 x MIN, as horovodrun
        self.assertFalse(book.usable("a", 115.0))
        self.assertEqual(book.blacklist("a", 115.0), 5)  # during its cool-down: no longer
        self.assertTrue(book.usable("a", 120.0))
        self.assertEqual(book.blacklist("a", 120.0), 40)
        self.assertEqual(book.blacklist("a", 200.0), 45)
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
                  tuttirun_args=["--min-np", "2", "--blacklist-cooldown-range", "60", "60",
                                 "--keep-host-workers"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 0, job.what)
        self.assertLess(job.wall, 40, job.what)
        self.assertIn("killed by signal 9", job.output, job.what)
        self.assertIn("generation 1: 2 worker(s)", job.output, job.what)
        self.assertEqual(job.output.count("of 2 (generation 1): step 120"), 2, job.what)
        self.assertEqual(job.output.count("replicas agree"), 2, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_reset_limit_stops_the_job(self):
        job = Job("gloo", 3, [TRAINER, "--steps", "120", "--die-at", "50"], limit=60,
                  tuttirun_args=["--min-np", "2", "--reset-limit", "0", "--keep-host-workers"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 1, job.what)
        self.assertLess(job.wall, 40, job.what)
        self.assertIn("reset limit reached: 0 generation(s) after the first (--reset-limit 0)",
                      job.output, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_finished_job_stops_a_replacement_still_starting(self):
        """Rank 1 exits 3 right after training; the launcher starts a replacement on the
        other host's free slot and publishes generation 1, but rank 0 finishes (in
        generation 0) instead of joining it: the job is done, the replacement is stopped
        (it would wait TUTTI_START_TIMEOUT_SECONDS for rank 0 and fail the job)."""
        job = Job("gloo", 2, [TRAINER, "--steps", "40", "--fail-at-end", "3",
                              "--linger-ms", "2000"], limit=60,
                  tuttirun_args=["-H", "localhost:2,127.0.0.1:1", "--min-np", "1",
                                 "--max-np", "2", "--keep-host-workers"])
        self.assertEqual(job.left, [], job.what)
        self.assertIn("generation 1: 2 worker(s) (w0 rank 0 on localhost, w2 rank 1 on "
                      "127.0.0.1)", job.output, job.what)
        self.assertIn("worker w0 finished in generation 0", job.output, job.what)
        self.assertIn("worker w2 is not in generation 0, where the job finished: stopping it",
                      job.output, job.what)
        self.assertEqual(job.rc, 0, job.what)
        self.assertLess(job.wall, 20, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_ctrl_c_stops_the_job(self):
        job = Job("gloo", 2, [TRAINER, "--steps", "100000", "--step-ms", "20"], limit=40,
                  interrupt_after=4, tuttirun_args=["--min-np", "2"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 128 + signal.SIGINT, job.what)
        self.assertIn("received SIGINT, stopping the job", job.output, job.what)
        self.assertLess(job.wall, 20, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_discovery_script_failing_mid_job_stops_it_after_the_elastic_timeout(self):
        """Only the first discovery is fatal: later failures keep the hosts found last, for
        at most --elastic-timeout."""
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "discover.sh")
            with open(script, "w") as f:  # fine for its first 4 runs, then broken
                f.write('#!/bin/sh\nn=$(cat %s/runs 2>/dev/null || echo 0); n=$((n + 1))\n'
                        'echo $n > %s/runs\n[ $n -le 4 ] || { echo broken >&2; exit 3; }\n'
                        'echo localhost:2\n' % (d, d))
            os.chmod(script, 0o755)
            job = Job("gloo", 2, [TRAINER, "--steps", "100000", "--step-ms", "20"], limit=40,
                      tuttirun_args=["--min-np", "2", "--host-discovery-script", script,
                                     "--discovery-interval", "0.5", "--elastic-timeout", "3"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 1, job.what)
        self.assertIn("warning: --host-discovery-script %s exited with code 3: broken; keeping "
                      "the hosts found last (localhost:2)" % script, job.output, job.what)
        self.assertIn("error: --host-discovery-script %s exited with code 3: broken; no "
                      "discovery succeeded for more than --elastic-timeout 3 s" % script,
                      job.output, job.what)
        self.assertLess(job.wall, 20, job.what)


def _script(d, text):
    path = os.path.join(d, "discover.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + text)
    os.chmod(path, 0o755)
    return path


class HorovodSemanticsTest(unittest.TestCase):
    """What horovodrun users count on (docs/elastic.md): a failed worker's host loses its
    other workers, a job without survivors ends, a slow discovery is survived, the first
    world takes every free slot, and workers see HOROVOD_RANK and HOROVOD_HOSTNAME."""

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_failed_worker_stops_its_hosts_other_workers(self):
        job = Job("gloo", 3, [TRAINER, "--steps", "120", "--die-at", "50"], limit=60,
                  tuttirun_args=["-H", "127.0.0.1:1,localhost:2", "--min-np", "1"])
        self.assertEqual(job.left, [], job.what)
        self.assertIn("worker w1 (pid", job.output, job.what)
        self.assertIn("host localhost blacklisted for 120 s with its workers", job.output,
                      job.what)
        self.assertIn("generation 1: 1 worker(s) (w0 rank 0 on 127.0.0.1)", job.output,
                      job.what)
        self.assertIn("of 1 (generation 1): step 120", job.output, job.what)
        self.assertEqual(job.rc, 0, job.what)

    def test_job_without_survivors_ends_naming_the_failures(self):
        """Every worker fails: the state is lost, so no fresh worker starts after the
        cool-down (it would train from the beginning); the job fails at once."""
        job = Job("gloo", 2, ["sh", "-c", "sleep 1; exit 3"], limit=40,
                  tuttirun_args=["-H", "localhost:1,127.0.0.1:1", "--min-np", "1",
                                 "--blacklist-cooldown-range", "0.2", "0.2"])
        self.assertEqual(job.left, [], job.what)
        self.assertEqual(job.rc, 1, job.what)
        self.assertRegex(job.output, r"error: no worker of generation [01] is left, so the "
                         r"training state is lost: stopping the job \(hosts: .*\); failed "
                         r"worker\(s\): w[01] \(exit code 3 on [^)]*\), w[01] \(exit code 3 ",
                         job.what)
        self.assertNotIn("w2", job.output, job.what)
        self.assertLess(job.wall, 15, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_one_slow_discovery_run_is_survived(self):
        with tempfile.TemporaryDirectory() as d:
            script = _script(d, 'n=$(cat %s/runs 2>/dev/null || echo 0); n=$((n + 1))\n'
                                'echo $n > %s/runs\n[ $n -ne 5 ] || sleep 3\n'
                                'echo localhost:2\n' % (d, d))
            job = Job("gloo", 2, [TRAINER, "--steps", "300", "--step-ms", "20"], limit=40,
                      tuttirun_args=["--min-np", "2", "--host-discovery-script", script,
                                     "--discovery-interval", "0.1"])
        self.assertEqual(job.left, [], job.what)
        self.assertIn("warning: --host-discovery-script %s did not finish within 1 s; keeping "
                      "the hosts found last (localhost:2)" % script, job.output, job.what)
        self.assertIn("--host-discovery-script %s works again" % script, job.output, job.what)
        self.assertEqual(job.rc, 0, job.what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_first_world_takes_every_free_slot(self):
        job = Job("gloo", 2, [TRAINER, "--steps", "40"], limit=40,
                  tuttirun_args=["-H", "localhost:4", "--min-np", "2", "--reset-limit", "0"])
        self.assertEqual(job.left, [], job.what)
        self.assertIn("generation 0: 4 worker(s)", job.output, job.what)
        self.assertNotIn("generation 1", job.output, job.what)
        self.assertEqual(job.rc, 0, job.what)

    def test_workers_get_horovods_variables(self):
        worker = os.path.join(HERE, "worker.py")
        for flags in (["--min-np", "2"], []):  # elastic, then the static launcher
            r = run(["-np", "2", "-H", "localhost:1,127.0.0.1:1"] + flags +
                    [PYTHON, worker, "env"], timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            seen = list(json.loads(line.split(":", 1)[1]) for line in r.stdout.splitlines()
                          if line.split(":", 1)[-1].startswith("{"))
            seen.sort(key=lambda e: e["HOROVOD_RANK"])
            self.assertEqual([(e["HOROVOD_RANK"], e["HOROVOD_HOSTNAME"], e["HOROVOD_SIZE"],
                               e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"],
                               e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"])
                              for e in seen],
                             [("0", "localhost", "2", "0", "1", "0", "2"),
                              ("1", "127.0.0.1", "2", "0", "1", "1", "2")], (flags, r.stdout))


def _set_subreaper(on):
    """Orphans of this process's descendants (workers of a dead tuttirun) become its
    children, so that their exit statuses can be read."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1 if on else 0, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class LauncherKilledTest(unittest.TestCase):
    """tuttirun dies by SIGKILL (nothing of it can stop its workers): each worker finds its
    launcher's server gone and stops itself, with a message, well within --elastic-timeout
    20 (docs/elastic.md, "When tuttirun dies")."""

    BOUND = 10.0  # seconds from tuttirun's death until no worker is left

    def kill_tuttirun_when(self, trainer_args, tuttirun_args, line):
        tmp = tempfile.mkdtemp()
        errors = os.path.join(tmp, "workers.stderr")  # the dead tuttirun forwards nothing
        marker = uuid.uuid4().hex
        env = dict(os.environ, TUTTI_EXIT_TEST_JOB=marker, TUTTI_TIMEOUT_SECONDS="5")
        command = [PYTHON, TUTTIRUN, "-np", "2", "--elastic-timeout", "20"] + tuttirun_args + [
            "sh", "-c", 'exec "$0" "$@" 2>>%s' % errors, TRAINER] + trainer_args
        _set_subreaper(True)
        statuses, output, workers = {}, b"", []
        try:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 40
            while line.encode() not in output and time.monotonic() < deadline:
                if select.select([proc.stdout], [], [], 0.5)[0]:
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    output += chunk
            self.assertIn(line.encode(), output, output.decode(errors="replace"))
            # A worker in the middle of an exec has no readable environment for a moment:
            # look again for up to 5 s before counting.
            expected = 2 if "--die-at" not in trainer_args else 1
            seen_by = time.monotonic() + 5
            while True:
                workers = [pid for pid in job_processes(marker) if pid != proc.pid]
                if len(workers) >= expected or time.monotonic() > seen_by:
                    break
                time.sleep(0.05)
            self.assertEqual(len(workers), expected, workers)
            time.sleep(2.0)  # under way
            os.kill(proc.pid, signal.SIGKILL)
            died = time.monotonic()
            proc.wait(10)
            proc.stdout.close()
            while job_processes(marker) and time.monotonic() < died + 60:
                time.sleep(0.05)
            gone_after = time.monotonic() - died
        finally:
            for pid in job_processes(marker):
                os.kill(pid, signal.SIGKILL)
            for pid in workers:  # the orphaned workers, now this process's (zombie) children
                try:
                    statuses[pid] = os.waitpid(pid, 0)[1]
                except ChildProcessError:
                    pass
            _set_subreaper(False)
        with open(errors) if os.path.exists(errors) else open(os.devnull) as f:
            text = f.read()
        what = "gone after %.1f s, statuses %s\n%s\n%s" % (
            gone_after, statuses, output.decode(errors="replace")[-2000:], text[-2000:])
        self.assertLess(gone_after, self.BOUND, what)
        for pid in workers:  # a failure: the SIGTERM of its own watch, or a failed init
            self.assertIn(pid, statuses, what)
            self.assertNotEqual(os.waitstatus_to_exitcode(statuses[pid]), 0, what)
        self.assertIn("the launcher's rendezvous server at 127.0.0.1:", text, what)
        self.assertIn("is gone (connection refused): tuttirun ended without stopping this "
                      "worker, so the job is over", text, what)

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_mid_training(self):
        self.kill_tuttirun_when(["--steps", "100000", "--step-ms", "20"], ["--min-np", "2"],
                                "generation 0: 2 worker(s)")

    @unittest.skipUnless(TRAINER, "ELASTIC_TRAINER (the C++ example) not built")
    def test_while_waiting_for_a_world(self):
        self.kill_tuttirun_when(["--steps", "100000", "--step-ms", "20", "--die-at", "5"],
                                ["--min-np", "2", "--keep-host-workers"],
                                "fewer than --min-np 2: waiting up to 20 s")


if __name__ == "__main__":
    unittest.main()
