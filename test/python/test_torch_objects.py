"""broadcast_object and allgather_object, and the basic topology queries."""

import os
import subprocess
import sys

import pytest
import torch

import tutti.torch as hvd


def test_topology(rank, size):
    assert hvd.is_initialized()
    assert 0 <= rank < size
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert 0 <= hvd.cross_rank() < hvd.cross_size() <= size
    assert isinstance(hvd.mpi_built(), bool) and isinstance(hvd.gloo_built(), bool)
    if size > 1:
        assert hvd.mpi_built() or hvd.gloo_built()
    assert hvd.cpu_backend() in ("mpi", "gloo", "loopback", "")
    if size > 1:
        assert hvd.mpi_enabled() != hvd.gloo_enabled()
    assert hvd.rocm_built() is False
    # Horovod's convention: the NCCL version number, 0 without NCCL.
    assert isinstance(hvd.nccl_built(), int) and not isinstance(hvd.nccl_built(), bool)
    assert (hvd.nccl_built() > 0) == hvd.cuda_built()
    ranks = hvd.allgather_object(rank, name="obj.ranks")
    assert ranks == list(range(size))


def test_broadcast_object(rank, size):
    for root in range(size):
        obj = {"rank": rank, "payload": list(range(rank * 3)), "text": "r%d" % rank}
        got = hvd.broadcast_object(obj, root_rank=root, name="obj.bc.%d" % root)
        assert got == {"rank": root, "payload": list(range(root * 3)), "text": "r%d" % root}
    # Default name (the type's name) and a tensor inside the object.
    got = hvd.broadcast_object((rank, torch.full((2,), float(rank))))
    assert got[0] == 0 and torch.equal(got[1], torch.zeros(2))


def test_allgather_object(rank, size):
    objs = hvd.allgather_object({"r": rank, "data": "x" * (rank * 100)}, name="obj.ag")
    assert objs == [{"r": r, "data": "x" * (r * 100)} for r in range(size)]
    assert hvd.allgather_object(None) == [None] * size


def test_init_is_idempotent_and_handles_are_ints(rank, size):
    hvd.init()
    assert hvd.rank() == rank and hvd.size() == size
    handle = hvd.allreduce_async(torch.ones(1), name="obj.handle", op=hvd.Sum)
    assert isinstance(handle, int)
    assert hvd.synchronize({handle: "key"}.popitem()[0]).item() == size
    try:
        hvd.poll(handle)
        raise AssertionError("poll of a synchronized handle did not fail")
    except ValueError:
        pass


# A job whose torch has no numpy (pip's torch does not require it): numpy's import fails.
_WITHOUT_NUMPY = r"""
import sys

# As if numpy were not installed: its import raises ModuleNotFoundError and
# importlib.util.find_spec("numpy") is None.
sys.modules["numpy"] = None
try:
    import torch
except ImportError:  # Debian's torch 1.13 imports numpy itself
    print("torch needs numpy")
    raise SystemExit(0)
import tutti.torch as hvd

try:
    torch.zeros(1).numpy()
except (RuntimeError, TypeError):
    pass
else:
    raise SystemExit("numpy is still available")
hvd.init()
assert hvd.broadcast_object({"a": [1, 2]}, root_rank=0) == {"a": [1, 2]}
assert hvd.allgather_object("x" * 5) == ["x" * 5]
model = torch.nn.Linear(3, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
hvd.broadcast_optimizer_state(opt, root_rank=0)
assert opt.param_groups[0]["lr"] == 0.01 and len(opt.state) == 2
hvd.shutdown()
print("ok")
"""


def test_objects_without_numpy(rank, size):
    """broadcast_object and allgather_object (and so broadcast_optimizer_state) in a
    process where numpy cannot be imported: a world of one, started by the single-process
    suite only (it costs a torch start)."""
    if size != 1:
        pytest.skip("runs in the single-process suite")
    prefixes = ("OMPI_", "PMIX_", "TUTTI_", "HOROVOD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_NUMPY], env=env, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode == 0 and output.strip().endswith("torch needs numpy"):
        pytest.skip("this torch cannot be imported without numpy")
    assert done.returncode == 0 and output.strip().endswith("ok"), output
