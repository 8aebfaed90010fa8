"""hvd.start_timeline / stop_timeline (as Horovod's test_timeline_api uses them) and
hvd.stats(). Run by every rank, like the other tests of this folder."""
import json
import os
import tempfile
import time

import torch

import tutti.torch as hvd


def _check_rank0_file(path, check_cycle):
    if hvd.rank() != 0:
        assert not os.path.exists(path) or os.path.getsize(path) == 0
        return
    with open(path) as f:
        text = f.read()
    json.loads(text)  # complete once stopped
    for needle in ("allreduce.test_allreduce", "start_time_since_epoch_in_micros",
                   "NEGOTIATE_ALLREDUCE", "ALLREDUCE"):
        assert needle in text, needle
    if check_cycle:
        assert "CYCLE_START" in text


def test_timeline_started_and_stopped_at_run_time():
    # Horovod's test_timeline_api, on this rank's own temporary file (a file path: rank 0
    # writes it). Each start with a new path begins a new file; the same path twice keeps it.
    for mark_cycles, twice in ((True, False), (False, False), (True, False), (False, True)):
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            hvd.start_timeline(path, mark_cycles=mark_cycles)
            if twice:
                hvd.start_timeline(path, mark_cycles=mark_cycles)
            time.sleep(0.05)
            for _ in range(2 if twice else 1):
                hvd.allreduce(torch.tensor([1, 2, 3], dtype=torch.float32), name="test_allreduce")
            time.sleep(0.05)
            hvd.stop_timeline()
            _check_rank0_file(path, mark_cycles)
        finally:
            os.remove(path)


def test_timeline_directory_every_rank():
    with tempfile.TemporaryDirectory() as tmp:
        # Every rank picks its own temporary directory; each writes rank-<rank>.json there.
        hvd.start_timeline(tmp + "/")
        hvd.allreduce(torch.ones(4), name="observe.dir")
        hvd.stop_timeline()
        with open(os.path.join(tmp, "rank-%d.json" % hvd.rank())) as f:
            events = json.load(f)
        names = {e.get("name") for e in events}
        assert {"QUEUED", "NEGOTIATE_ALLREDUCE", "WAIT_FOR_BATCH", "ALLREDUCE",
                "CALLBACK"} <= names, names
        assert "allreduce.observe.dir" in {e.get("args", {}).get("name") for e in events}


def test_stats_count_ops_and_bytes():
    before = hvd.stats()
    # The backend that served them: shm when every rank is on this host, else the transport.
    backend = "shm" if hvd.size() > 1 and hvd.local_size() == hvd.size() else hvd.cpu_backend()
    key = "op.allreduce.%s." % backend
    for i in range(3):
        hvd.allreduce(torch.ones(10, dtype=torch.float64), name="observe.stats")
    hvd.broadcast(torch.ones(5, dtype=torch.float32), root_rank=0, name="observe.bcast")
    after = hvd.stats()
    assert after[key + "tensors"] - before.get(key + "tensors", 0) == 3
    assert after[key + "bytes"] - before.get(key + "bytes", 0) == 3 * 80
    bkey = "op.broadcast.%s." % backend
    assert after[bkey + "bytes"] - before.get(bkey + "bytes", 0) == 20
    assert after["cache.hits"] - before["cache.hits"] >= 2  # the same allreduce, cached
    for name in ("rounds", "cache.misses", "fusion.batches", "time.negotiation_ns",
                 "time.backend_ns", "errors"):
        assert isinstance(after[name], int) and after[name] >= 0, name
