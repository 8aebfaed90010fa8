"""Timelines, logs and counters of real jobs (job.py over libtutti's C API).

Environment: TUTTI_LIB, TUTTIRUN, TUTTI_TIMELINE_CMD, MPIRUN (empty: no MPI build).
Every job runs in its own process group with a deadline and is killed whole on failure.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "job.py")
PYTHON = sys.executable
TUTTIRUN = os.environ.get("TUTTIRUN", "")
MPIRUN = os.environ.get("MPIRUN", "")
TIMELINE = os.environ.get("TUTTI_TIMELINE_CMD", "")
DEADLINE = 60
NP, VICTIM, KILL_STEP, STEPS = 4, 2, 8, 200


def run(cmd, env=None):
    """Runs a job to its end (or the deadline, then kills its process group)."""
    env = dict(os.environ, **(env or {}))
    env.setdefault("TUTTI_TIMEOUT_SECONDS", "30")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError("job passed its %d s deadline: %s\n%s" % (DEADLINE, cmd, err.decode()))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the job left behind
        except ProcessLookupError:
            pass
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def mpirun(np, args):
    return [MPIRUN, "-np", str(np), "--oversubscribe", "--bind-to", "none",
            "--mca", "btl", "self,vader"] + args


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def read_rank_file(path):
    """The events of a rank's file, checked line by line: '[', one whole JSON object per
    line, ']' only if the rank closed it. A killed rank may have its last line cut short
    (only then is one line allowed not to parse). Returns (events, closed)."""
    with open(path) as f:
        lines = f.read().split("\n")
    assert lines[0] == "[", (path, lines[:2])
    events, closed = [], False
    body = [l for l in lines[1:] if l != ""]
    for i, line in enumerate(body):
        if line == "]":
            closed = True
            assert i == len(body) - 1, (path, "text after the closing bracket")
            break
        try:
            events.append(json.loads(line[:-1] if line.endswith(",") else line))
        except ValueError:
            assert i == len(body) - 1, (path, "line %d does not parse: %r" % (i + 2, line))
    if closed:
        json.loads("\n".join(lines))  # strict JSON once closed
    return events, closed


def rows(events):
    """{row label: [event, ...]} of one rank's tensor rows."""
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = {}
    for e in events:
        if e.get("ph") != "M" and e.get("tid") in names:
            out.setdefault(names[e["tid"]], []).append(e)
    return out


def spans(row_events, name):
    """(begin, end) of every `name` phase of one row: nested B/E pairs and X events."""
    stack, found = [], []
    for e in row_events:
        if e["ph"] == "X" and e["name"] == name:
            found.append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "B":
            stack.append(e)
        elif e["ph"] == "E" and stack:
            b = stack.pop()
            if b["name"] == name:
                found.append((b["ts"], e["ts"]))
    return found


class KilledJobTimeline(unittest.TestCase):
    """A 4-rank job, rank 2 SIGKILLed at step 8: every rank's file is readable, the merged
    trace loads, and each op shows its phases, aligned across ranks on the job clock."""

    def check_job(self, cmd, env, backend, algorithms):
        tmp = tempfile.mkdtemp(prefix="tutti-observe-")
        try:
            tl = os.path.join(tmp, "tl") + "/"
            code, out, err = run(cmd(tl), dict(env, TUTTI_TIMELINE=tl))
            self.assertNotEqual(code, 0, "the job should fail when a rank is killed\n" + err)
            files = sorted(os.listdir(tl))
            self.assertEqual(files, ["rank-%d.json" % r for r in range(NP)], err)
            per_rank = {r: read_rank_file(os.path.join(tl, "rank-%d.json" % r))[0]
                        for r in range(NP)}
            merged = os.path.join(tmp, "job.json")
            done = subprocess.run([PYTHON, TIMELINE, "merge", tl, "-o", merged], timeout=60,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.assertEqual(done.returncode, 0, done.stderr.decode())
            with open(merged) as f:
                trace = json.load(f)
            self.assertEqual({e["pid"] for e in trace}, set(range(NP)))
            survivors = [r for r in range(NP) if r != VICTIM]
            phases = ["QUEUED", "NEGOTIATE_ALLREDUCE", "WAIT_FOR_BATCH", "ALLREDUCE",
                      backend + "_ALLREDUCE", "CALLBACK"]
            done_steps = KILL_STEP - 1  # every rank finished these before the kill
            for r in survivors:
                tensor_rows = rows(per_rank[r])
                for name in ("allreduce.grad.a", "allreduce.grad.b", "allreduce.grad.c"):
                    self.assertIn(name, tensor_rows, "rank %d" % r)
                    for phase in phases:
                        self.assertGreaterEqual(len(spans(tensor_rows[name], phase)), done_steps,
                                                "rank %d %s %s" % (r, name, phase))
                self.assertGreaterEqual(len(spans(tensor_rows["broadcast.weights"],
                                                  backend + "_BROADCAST")), done_steps)
                self.assertTrue(any(e.get("name") == "ROUND" for e in per_rank[r]))
                # The backend call names its algorithm.
                used = {e["args"].get("algorithm") for e in tensor_rows["allreduce.grad.a"]
                        if e.get("name") == backend + "_ALLREDUCE" and e["ph"] in "BX"}
                self.assertTrue(used and used <= algorithms, (r, used))
            self.assertTrue(any(e.get("name") == "REQUEST" for e in per_rank[0]))
            # One clock: the k-th allreduce of grad.b is one collective, so every rank was
            # inside it at one moment (no rank can leave before the last one entered).
            errors = [next(e["args"]["error_us"] for e in per_rank[r]
                           if e.get("name") == "job_clock") for r in range(NP)]
            slack = 2 * max(errors) + 1000
            calls = {r: spans(rows(per_rank[r])["allreduce.grad.b"], backend + "_ALLREDUCE")
                     for r in survivors}
            for k in range(done_steps):
                latest_begin = max(calls[r][k][0] for r in survivors)
                earliest_end = min(calls[r][k][1] for r in survivors)
                self.assertLessEqual(latest_begin, earliest_end + slack,
                                     "call %d: %s" % (k, [calls[r][k] for r in survivors]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @unittest.skipUnless(TUTTIRUN, "no tuttirun")
    def test_tuttirun_gloo(self):  # shm off: gloo's own calls
        self.check_job(lambda tl: [TUTTIRUN, "-np", str(NP), "--gloo", PYTHON, JOB, str(STEPS),
                                   str(VICTIM), str(KILL_STEP)], {"TUTTI_SHM": "0"}, "GLOO",
                       {"ring"})

    @unittest.skipUnless(MPIRUN, "no MPI")
    def test_mpirun(self):  # one host: the shm backend serves the ops
        self.check_job(lambda tl: mpirun(NP, [PYTHON, JOB, str(STEPS), str(VICTIM),
                                              str(KILL_STEP)]), MPI_ENV, "SHM",
                       {"shm one-round", "shm reduce-scatter+allgather"})


@unittest.skipUnless(TUTTIRUN, "no tuttirun")
class LogsAndCounters(unittest.TestCase):
    def test_info_logs_once_and_counters(self):
        steps = 5
        code, out, err = run([TUTTIRUN, "-np", "2", "--gloo", "--log-level", "INFO",
                              "--cycle-time-ms", "2.5", "-x", "TUTTI_STATS=1",
                              PYTHON, JOB, str(steps)])
        self.assertEqual(code, 0, err)
        for needle in ("settings in force:", "TUTTI_LOG_LEVEL=info (tuttirun)",
                       "TUTTI_CYCLE_TIME_MS=2.5 (tuttirun)", "TUTTI_FUSION_THRESHOLD=134217728 (default)",
                       "TUTTI_STATS=1 (environment)", "TUTTI_SECRET=(set)",
                       "topology: 2 rank(s) from tuttirun",
                       "process set 0 (ranks 0, 1): connected over gloo; backends in order: shm gloo",
                       "TUTTI_SHM=1 (default)",
                       "cpu: allreduce=shm allgather=shm broadcast=shm",
                       "job clock: every rank's offset to rank 0 measured"):
            self.assertIn(needle, err)
        self.assertNotIn("[tutti info rank 1]", err)  # once per job, on rank 0
        self.assertNotIn(os.environ.get("TUTTI_SECRET", "no secret here") + "\n", err)
        # Counters (one host: the shm backend serves the ops): the C API's values after a known sequence, and TUTTI_STATS at shutdown.
        for rank in (0, 1):
            m = re.search(r"rank %d stats (.*)" % rank, out)
            self.assertTrue(m, out)
            s = dict((k, int(v)) for k, v in (kv.split("=") for kv in m.group(1).split()))
            self.assertEqual(s["op.allreduce.shm.tensors"], 3 * steps)
            self.assertEqual(s["op.allreduce.shm.bytes"], 4 * 4200 * steps)
            self.assertEqual(s["op.allreduce.shm.tensors"],
                             s["fusion.tensors"] + s["op.allreduce.shm.calls"] - s["fusion.batches"])
            self.assertEqual(s["op.broadcast.shm.calls"], steps)
            self.assertEqual(s["op.broadcast.shm.bytes"], 64 * steps)
            self.assertEqual(s["cache.misses"], 4)
            self.assertEqual(s["cache.hits"], 4 * (steps - 1))
            self.assertEqual(s["errors"], 0)
            self.assertIn("[tutti rank %d] counters at shutdown (TUTTI_STATS=1)" % rank, err)
        self.assertRegex(err, r"  op\.allreduce\.shm\.calls \d+")

    def test_debug_and_trace_in_any_case(self):
        code, out, err = run([TUTTIRUN, "-np", "2", "--gloo", PYTHON, JOB, "2"],
                             {"TUTTI_LOG_LEVEL": "Trace"})
        self.assertEqual(code, 0, err)
        self.assertIn("[tutti debug rank 1] settings in force:", err)  # every rank at debug
        self.assertRegex(err, r"\[tutti debug rank 1\] round \d+, process set 0: .*allreduce 'grad\.a'")
        self.assertIn("[tutti trace rank 1] submit allreduce 'grad.b' (process set 0, handle", err)
        code, out, err = run([TUTTIRUN, "-np", "2", "--gloo", PYTHON, JOB, "1"],
                             {"TUTTI_LOG_LEVEL": "ERROR"})
        self.assertEqual(code, 0, err)
        self.assertNotIn("[tutti", err)


@unittest.skipUnless(TUTTIRUN, "no tuttirun")
class Autotune(unittest.TestCase):
    def test_recovers_from_bad_settings_on_every_rank_at_once(self):
        tmp = tempfile.mkdtemp(prefix="tutti-autotune-")
        try:
            csv = os.path.join(tmp, "autotune.csv")
            code, out, err = run(
                [TUTTIRUN, "-np", "2", "--gloo", "--autotune", "--autotune-log-file", csv,
                 "--fusion-threshold-mb", str(4096 / 1048576.0), "--cycle-time-ms", "20",
                 # Runs until the tuner has logged its choice (52 windows of 50 ms: a fixed
                 # step count ran out first on a fast machine), at most 200000 steps.
                 PYTHON, os.path.join(HERE, "throughput.py"), "200000", "64", "4096", csv],
                {"TUTTI_LOG_LEVEL": "debug", "TUTTI_AUTOTUNE_WINDOW_SECONDS": "0.05",
                 "TUTTI_AUTOTUNE_WARMUP_WINDOWS": "1", "TUTTI_AUTOTUNE_SAMPLES": "3"})
            self.assertEqual(code, 0, err[-3000:])
            m = re.search(r"\[tutti info rank 0\] autotune: done after 52 windows: fusion "
                          r"threshold (\d+) bytes, cycle time ([\d.]+) ms, cache (on|off)", err)
            self.assertTrue(m, err[-3000:])
            with open(csv) as f:
                lines = f.read().splitlines()
            # The choice is the best median the tuner measured (at a 20 ms cycle the fusion
            # threshold barely moves the throughput, so which threshold wins is the machine's
            # noise): replay its log, candidate by candidate, and compare.
            rows = [l.split(",") for l in lines[1:]]
            groups = []  # consecutive scored windows of one stage and one setting
            for r in rows:
                if r[7] != "1":
                    continue
                if groups and groups[-1][0] == r[1:6]:
                    groups[-1][1].append(float(r[6]))
                else:
                    groups.append((r[1:6], [float(r[6])]))
            self.assertEqual([g[0][0] for g in groups],
                             ["fusion"] * 6 + ["cycle"] * 5 + ["cache"] * 2, groups)
            best, best_score = None, -1.0
            for setting, scores in groups:
                self.assertEqual(len(scores), 3, groups)
                if sorted(scores)[1] > best_score:
                    best, best_score = setting[1:], sorted(scores)[1]
            self.assertEqual(rows[-1][2:6], best, groups)
            self.assertEqual(m.group(1), best[0])
            # Which cycle time wins is the machine's load too (the suite runs beside a compiler
            # at nice 19; CI once measured the 20 ms start best): the replay above is the check
            # that the tuner chose what it measured best, whatever that was.
            self.assertEqual(float(m.group(2)), float(best[1]))
            self.assertIn(float(m.group(2)), [20.0, 0.5, 1.0, 2.0, 5.0])  # a candidate it tried
            self.assertEqual(lines[0], "window,stage,fusion_threshold,cycle_time_ms,cache,"
                                       "hierarchical,bytes_per_second,scored")
            self.assertEqual(len(lines), 1 + 52 + 1)  # 1 + 23 + 20 + 8 windows
            self.assertTrue(lines[-1].startswith("52,done,%s," % m.group(1)), lines[-1])
            self.assertTrue(lines[1].startswith("1,warmup,4096,20,1,-1,"), lines[1])
            # The cache was tried off (and the job kept giving right answers meanwhile:
            # throughput.py checks every result).
            self.assertTrue(any(",cache," in l and l.split(",")[4] == "0" for l in lines), lines)
            # Every change reached both ranks in the same round.
            changes = {r: re.findall(r"\[tutti debug rank %d\] autotune: (fusion threshold "
                                     r"\d+ bytes, cycle time [\d.]+ ms, cache o\w+ from round "
                                     r"\d+)" % r, err)
                       for r in (0, 1)}
            self.assertGreaterEqual(len(changes[0]), 5)
            self.assertTrue(any("cache off" in c for c in changes[0]), changes[0])
            self.assertEqual(changes[0], changes[1])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
