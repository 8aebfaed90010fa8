"""broadcast_object and allgather_object, and the basic topology queries."""

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
