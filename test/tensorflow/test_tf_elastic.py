"""Elastic TensorFlow and Keras jobs (docs/elastic.md): tf_elastic_train.py under tuttirun's
elastic flags on this host, with a worker killed and with slots added, as
test/python/test_torch_elastic.py does for torch.

These launch jobs of their own, so they run only from their own CTest entry
(tensorflow_elastic, TUTTI_ELASTIC_TESTS=1), never inside the rank-per-process suites.
Each job has a deadline; what it leaves behind is found and killed (exit_jobs.Job)."""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
from exit_jobs import Job  # noqa: E402
import tf_elastic_train  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_ELASTIC_TESTS") != "1",
                                reason="launches jobs: run by the tensorflow_elastic test")

LIMIT = 80  # seconds for one job: every worker starts TensorFlow, on two shared cores


def launch(tmp_path, np_, flags, script_args=()):
    log, out = tmp_path / "log.jsonl", tmp_path / "out"
    out.mkdir()
    program = [sys.executable, os.path.join(HERE, "tf_elastic_train.py"), "--log", str(log),
               "--out", str(out)] + list(script_args)
    # Workers start TensorFlow and trace functions at different times on shared cores: an
    # op deadline of a few seconds would reset the job by itself.
    job = Job("gloo", np_, program, limit=LIMIT, tuttirun_args=list(flags) + ["--"],
              env={"TF_CPP_MIN_LOG_LEVEL": "3", "TUTTI_TIMEOUT_SECONDS": "30"})
    records = [json.loads(line) for line in open(log)] if log.exists() else []
    finals = {}
    for path in out.glob("*.npz"):
        with np.load(str(path)) as saved:
            finals[path.stem] = [saved["arr_%d" % i] for i in range(len(saved.files))]
    return job, records, finals


def assert_same(finals, reference, what):
    assert finals, what
    for worker, weights in finals.items():
        for got, want in zip(weights, reference):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9,
                                       err_msg="%s: %s" % (what, worker))


KILL_FLAGS = ["--min-np", "2", "--blacklist-cooldown-range", "120", "120",
              "--keep-host-workers"]


def finished_after_a_kill(job, records, survivors):
    """The job of 3 lost one worker and ended in generation 1 with `survivors`, each of
    which had one try of its training function end with an error: their "done" and "error"
    records."""
    assert job.left == [] and job.rc == 0, job.what
    assert "killed by signal 9" in job.output and "generation 1: 2 worker(s)" in job.output, \
        job.what
    done = [r for r in records if r["event"] == "done"]
    assert sorted(r["worker"] for r in done) == survivors, job.what
    assert {(r["size"], r["gen"]) for r in done} == {(2, 1)}, job.what
    errors = [r for r in records if r["event"] == "error"]
    assert sorted(r["worker"] for r in errors) == survivors, errors
    return done, errors


def test_killed_worker_tape_job_goes_on_from_the_last_commit(tmp_path):
    """kill -9 of one of 3 workers at step 3 (commits every 2): the other 2 get
    HorovodInternalError from their next allreduce, restore step 2's commit, go on in
    generation 1 and end with identical weights, those a replay of the world sizes gives."""
    job, records, finals = launch(tmp_path, 3, KILL_FLAGS,
                                  ["--mode", "tape", "--kill-rank", "1", "--kill-at", "3"])
    done, errors = finished_after_a_kill(job, records, ["w0", "w2"])
    assert all(r["internal"] for r in errors), errors  # eager: HorovodInternalError
    schedules = {tuple(r["sizes"]) for r in done}
    assert len(schedules) == 1, schedules
    schedule = list(schedules.pop())
    assert schedule[:2] == [3, 3] and set(schedule[2:]) == {2} and len(schedule) == 12, \
        schedule
    assert_same(finals, tf_elastic_train.replay(schedule, lr=0.05),
                "elastic vs replay " + str(schedule))


def test_discovered_slots_grow_the_tape_job_and_the_new_worker_gets_the_state(tmp_path):
    """The discovery script lists 2 slots, then 3: a third worker starts, the two running
    ones re-initialize at their next commit, and all three end with the same weights."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    job, records, finals = launch(
        tmp_path, 2, ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
                      "--discovery-interval", "0.3"],
        ["--mode", "tape", "--grow-file", str(hosts), "--grow-hosts", "localhost:3",
         "--grow-at", "3"])
    assert job.left == [] and job.rc == 0, job.what
    assert "generation 1: 3 worker(s)" in job.output, job.what
    done = [r for r in records if r["event"] == "done"]
    assert sorted(r["worker"] for r in done) == ["w0", "w1", "w2"], job.what
    assert {r["size"] for r in done} == {3}, job.what
    starts = [r for r in records if r["event"] == "start" and r["worker"] == "w2"]
    assert starts and starts[0]["batch"] > 0, "w2 did not start from the synced state: %s" % (
        starts,)
    assert {r["cls"] for r in records if r["event"] == "error"} == {"HostsUpdatedInterrupt"}, \
        job.what
    schedule = done[0]["sizes"]
    assert all(r["sizes"] == schedule for r in done), done
    assert 2 in schedule and 3 in schedule and len(schedule) == 12, schedule
    assert_same(finals, tf_elastic_train.replay(schedule, lr=0.05),
                "elastic vs replay " + str(schedule))


def test_killed_worker_keras_fit_job_finishes_with_the_rest(tmp_path):
    """model.fit with the elastic callbacks under hvd.elastic.run, 3 workers, one killed in
    the second epoch: fit's tf.function raises a recoverable tf.errors.OpError on the
    others, which run() restores, resets and fits again for the epochs left; both end the
    3 epochs in generation 1 with identical weights."""
    job, records, finals = launch(
        tmp_path, 3, KILL_FLAGS,
        ["--mode", "fit", "--kill-rank", "2", "--kill-at", "1003", "--epochs", "3"])
    done, errors = finished_after_a_kill(job, records, ["w0", "w1"])
    assert {r["epoch"] for r in done} == {3}, done
    assert all(r["op_error"] for r in errors), errors  # out of fit's tf.function
    restarts = [r for r in records if r["event"] == "start" and r["gen"] == 1]
    assert restarts and {r["epoch"] for r in restarts} == {1}, restarts
    assert len(finals) == 2, job.what
    assert_same(finals, finals["w0"], "workers disagree")
    assert all(np.all(np.isfinite(w)) for w in finals["w0"]), finals
