"""Elastic jobs (docs/elastic.md): elastic_train.py, a horovod.torch elastic script, under
tuttirun's elastic flags on this host, with a worker killed, slots added, too few left, and
a host dropped by discovery.

These launch jobs of their own, so they run only from their own CTest entry
(python_torch_elastic, TUTTI_ELASTIC_TESTS=1), never inside the rank-per-process suites.
Each job has a deadline; what it leaves behind is found and killed (exit_jobs.Job)."""
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
from exit_jobs import Job  # noqa: E402
import elastic_train  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TUTTI_ELASTIC_TESTS") != "1",
                                reason="launches jobs: run by the python_torch_elastic test")

LIMIT = 60  # seconds for one job, on two shared cores


def launch(tmp_path, np, flags, script_args=()):
    log, out = tmp_path / "log.jsonl", tmp_path / "out"
    out.mkdir()
    program = [sys.executable, os.path.join(HERE, "elastic_train.py"), "--log", str(log),
               "--out", str(out)] + list(script_args)
    # "--": the script's own flags (--log, --out) must not be read as tuttirun's.
    job = Job("gloo", np, program, limit=LIMIT, tuttirun_args=list(flags) + ["--"])
    records = [json.loads(line) for line in open(log)] if log.exists() else []
    finals = {p.stem: torch.load(str(p)) for p in out.glob("*.pt")}
    return job, records, finals


def schedule_of(records):
    """World sizes of the steps the final model is made of, from rank 0's notes: a reset
    returns to the last commit (after a host update that is the current step)."""
    steps, committed = [], 0
    for r in records:
        if r.get("event") == "step":
            steps.append(r["size"])
        elif r.get("event") == "commit":
            committed = len(steps)
        elif r.get("event") == "reset" and r["worker"] == "w0":
            del steps[committed:]
    return steps


def assert_same(finals, reference, what):
    for worker, params in finals.items():
        for got, want in zip(params, reference):
            assert torch.allclose(got, want, rtol=0, atol=1e-9), "%s: %s\n%s\n%s" % (
                what, worker, got, want)


def test_killed_worker_job_finishes_with_the_rest_from_the_last_commit(tmp_path):
    """kill -9 of one of 4 workers mid-epoch: the other 3 restore the last commit, go on in
    generation 1, and end with the model a non-elastic run of the same world sizes makes."""
    job, records, finals = launch(
        tmp_path, 4, ["--min-np", "2", "--blacklist-cooldown-range", "120", "120",
                      "--keep-host-workers"],
        ["--kill-rank", "2", "--kill-at", "3", "--commit-every", "2"])
    assert job.left == [] and job.rc == 0, job.what
    assert "killed by signal 9" in job.output and "generation 1: 3 worker(s)" in job.output, \
        job.what
    done = [r for r in records if r["event"] == "done"]
    assert sorted(r["worker"] for r in done) == ["w0", "w1", "w3"], job.what
    assert {r["size"] for r in done} == {3} and {r["gen"] for r in done} == {1}, job.what
    schedule = schedule_of(records)
    assert schedule[:2] == [4, 4] and set(schedule[2:]) == {3}, schedule
    reference = elastic_train.replay(schedule, epochs=2, lr=0.05, commit_every=2)
    assert_same(finals, list(reference.parameters()), "elastic vs replay " + str(schedule))


def discovery(tmp_path, listed):
    """A hosts file listing `listed` and a discovery script that prints it (the job edits the
    file to change what discovery finds)."""
    hosts = tmp_path / "hosts"
    hosts.write_text(listed)
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    return hosts, script


def test_discovered_slots_grow_the_job_and_new_workers_get_the_state(tmp_path):
    """The discovery script lists 2 slots, then 3: a third worker starts, the two running
    ones re-initialize at their next commit, and all three end with the same model."""
    hosts, script = discovery(tmp_path, "localhost:2\n")
    job, records, finals = launch(
        tmp_path, 2, ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
                      "--discovery-interval", "0.3"],
        ["--grow-file", str(hosts), "--grow-hosts", "localhost:3", "--grow-at", "3"])
    assert job.left == [] and job.rc == 0, job.what
    assert "generation 1: 3 worker(s)" in job.output, job.what
    done = [r for r in records if r["event"] == "done"]
    assert sorted(r["worker"] for r in done) == ["w0", "w1", "w2"], job.what
    assert {r["size"] for r in done} == {3}, job.what
    starts = [r for r in records if r["event"] == "start" and r["worker"] == "w2"]
    assert starts and starts[0]["batch"] > 0, "w2 did not start from the synced state: %s" % (
        starts,)
    reference = finals["w0"]
    assert_same(finals, reference, "workers disagree")
    schedule = schedule_of(records)
    assert 2 in schedule and 3 in schedule, schedule
    assert_same({"replay": list(elastic_train.replay(schedule, 2, 0.05, 2).parameters())},
                reference, "elastic vs replay " + str(schedule))


def test_too_few_workers_past_the_elastic_timeout_fail_the_job(tmp_path):
    """--min-np 2 with one of 2 workers killed: after --elastic-timeout the job fails with a
    message that says so, in bounded time, and nothing is left running."""
    job, _, _ = launch(tmp_path, 2, ["--min-np", "2", "--elastic-timeout", "2",
                                     "--keep-host-workers"],
                       ["--kill-rank", "1", "--kill-at", "1"])
    assert job.left == [] and job.rc == 1, job.what
    assert "fewer than --min-np 2, for more than --elastic-timeout 2 s" in job.output, job.what
    assert job.wall < 40, job.what


def test_dropped_host_leaves_at_its_next_commit(tmp_path):
    """Discovery drops rank 0's host at step 3: its worker has no seat in generation 1 and
    leaves at the next commit (step 4) with the others, which go on from there without a
    restore; the launcher stops the dropped worker once generation 1 has formed."""
    hosts, script = discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    job, records, finals = launch(
        tmp_path, 2, ["--min-np", "1", "--host-discovery-script", str(script),
                      "--discovery-interval", "0.2"],
        ["--grow-file", str(hosts), "--grow-hosts", "127.0.0.1:1", "--grow-at", "3",
         "--commit-every", "2"])
    assert job.left == [] and job.rc == 0, job.what
    assert "host localhost: no longer discovered; worker w0 has no seat in the next " \
        "generation" in job.output, job.what
    assert "generation 1: 1 worker(s) (w1 rank 0 on 127.0.0.1)" in job.output, job.what
    assert "has not left" not in job.output, job.what
    done = [r for r in records if r["event"] == "done"]
    assert [(r["worker"], r["size"], r["gen"]) for r in done] == [("w1", 1, 1)], job.what
    starts = [r["batch"] for r in records if r["event"] == "start" and r["gen"] == 1]
    assert starts == [4], "w1 did not go on from the commit after step 3: %s" % starts
    schedule = schedule_of(records)
    assert schedule[:4] == [2, 2, 2, 2] and set(schedule[4:]) == {1}, schedule
    assert_same(finals, list(elastic_train.replay(schedule, 2, 0.05, 2).parameters()),
                "elastic vs replay " + str(schedule))
