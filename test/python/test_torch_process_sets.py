"""Process sets: collectives over subsets of the ranks, added after init."""

import pytest
import torch

import tutti.torch as hvd


@pytest.fixture
def sets():
    """The even and the odd ranks' sets, for one test: a set's ranks must differ from every
    registered set's, so the tests that add their own run with none of these."""
    size = hvd.size()
    if size == 1:
        pytest.skip("a set other than the global one needs 2 ranks")
    even = hvd.add_process_set(list(range(0, size, 2)))
    odd = hvd.add_process_set(hvd.ProcessSet(list(range(1, size, 2)))) if size > 1 else None
    yield even, odd
    assert hvd.remove_process_set(even)
    if odd is not None:
        assert hvd.remove_process_set(odd)
    assert even.process_set_id is None


def my_set(sets, rank):
    even, odd = sets
    return even if rank % 2 == 0 else odd


def test_membership(sets, rank, size):
    even, odd = sets
    assert even.process_set_id > 0
    assert even.ranks == list(range(0, size, 2))
    assert even.size() == len(even.ranks)
    assert even.included() == (rank % 2 == 0)
    assert even.rank() == (rank // 2 if rank % 2 == 0 else -1)
    assert hvd.global_process_set.size() == size
    assert hvd.global_process_set.rank() == rank
    if odd is not None:
        assert odd.process_set_id not in (0, even.process_set_id)


def test_allreduce_in_set(sets, rank, size):
    ps = my_set(sets, rank)
    out = hvd.allreduce(torch.full((3,), float(rank)), name="ps.ar", op=hvd.Sum,
                        process_set=ps)
    assert torch.equal(out, torch.full((3,), float(sum(ps.ranks))))
    avg = hvd.allreduce(torch.full((2,), float(rank)), name="ps.avg", process_set=ps)
    assert torch.allclose(avg, torch.full((2,), sum(ps.ranks) / len(ps.ranks)))


def test_other_ops_in_set(sets, rank, size):
    ps = my_set(sets, rank)
    gathered = hvd.allgather(torch.tensor([rank]), name="ps.ag", process_set=ps)
    assert gathered.tolist() == ps.ranks
    # root_rank is a GLOBAL rank, as in Horovod (not a position in the set).
    root_global = ps.ranks[-1]
    out = hvd.broadcast(torch.tensor([float(rank)]), root_rank=root_global,
                        name="ps.bc", process_set=ps)
    assert out.item() == float(root_global)
    n = len(ps.ranks)
    scattered = hvd.reducescatter(torch.full((n, 2), float(rank)), name="ps.rs", op=hvd.Sum,
                                  process_set=ps)
    assert torch.equal(scattered, torch.full((1, 2), float(sum(ps.ranks))))
    received = hvd.alltoall(torch.full((n,), rank), name="ps.a2a", process_set=ps)
    assert received.tolist() == ps.ranks
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object({"from": rank}, root_rank=ps.ranks[0], name="ps.obj",
                                process_set=ps) == {"from": ps.ranks[0]}


def test_broadcast_root_outside_set_is_rejected(sets, rank, size):
    ps = my_set(sets, rank)
    outside = [r for r in range(size) if r not in ps.ranks]
    if not outside:
        pytest.skip("every rank is in this set")
    with pytest.raises(ValueError, match="root_rank %d is not in the process set"
                       % outside[0]):
        hvd.broadcast(torch.ones(1), root_rank=outside[0], name="ps.bc.out", process_set=ps)


def test_non_member_is_rejected(sets, rank, size):
    if size == 1:
        pytest.skip("every rank is in every set of a world of one")
    even, odd = sets
    other = odd if rank % 2 == 0 else even
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), name="ps.nonmember", process_set=other)
    out = hvd.allreduce(torch.ones(2), name="ps.after_nonmember", op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(size)))


def test_interleaved_sets_and_global(sets, rank, size):
    ps = my_set(sets, rank)
    h_set = hvd.allreduce_async(torch.full((4,), 1.0), name="ps.mix", op=hvd.Sum,
                                process_set=ps)
    h_global = hvd.allreduce_async(torch.full((4,), 1.0), name="ps.mix.global", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h_global), torch.full((4,), float(size)))
    assert torch.equal(hvd.synchronize(h_set), torch.full((4,), float(len(ps.ranks))))


def test_add_and_remove_again(rank, size):
    if size == 1:
        pytest.skip("a set other than the global one needs 2 ranks")
    ps = hvd.add_process_set([0])
    try:
        if rank == 0:
            out = hvd.allreduce(torch.ones(2), name="ps.single", op=hvd.Sum, process_set=ps)
            assert torch.equal(out, torch.ones(2))
        with pytest.raises(ValueError):
            hvd.add_process_set(ps)  # already registered
    finally:
        assert hvd.remove_process_set(ps)
    assert not hvd.remove_process_set(ps)
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_duplicates_are_refused_and_ids_reused(rank, size):
    """Horovod's rules: a set's ranks differ from every other set's (the global set's
    included), and a removed set's id is given to the next set."""
    with pytest.raises(ValueError, match=r"ranks \[%s\] are those of the global process set 0"
                       % ", ".join(str(r) for r in range(size))):
        hvd.add_process_set(list(range(size - 1, -1, -1)))
    if size == 1:
        return
    first = hvd.add_process_set([0])
    second = hvd.add_process_set([size - 1])
    try:
        with pytest.raises(ValueError, match=r"ranks \[0\] are those of process set %d"
                           % first.process_set_id):
            hvd.add_process_set(hvd.ProcessSet([0]))
        old = first.process_set_id
        assert hvd.remove_process_set(first)
        again = hvd.add_process_set([0])
        assert again.process_set_id == old, (again.process_set_id, old)
        t = hvd.allreduce(torch.ones(2), name="ps.reused", op=hvd.Sum, process_set=again) \
            if rank == 0 else None
        if rank == 0:
            assert torch.equal(t, torch.ones(2))
        assert hvd.remove_process_set(again)
    finally:
        assert hvd.remove_process_set(second)
