"""Every collective of tutti.jax, outside and inside jax.jit, for every dtype where it means
something and counts 0, 1 and odd, checked against the values every rank computes for all."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tutti.jax as tj
from conftest import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, all_rank_values, f64, rank_values

MODES = ["eager", "jit"]
COUNTS = [0, 1, 7]


def run(mode, fn, *args):
    if mode == "eager":
        return fn(*args)
    return jax.jit(fn)(*args)


def expected_reduce(values, op):
    stack = np.stack([v.astype(np.float64) for v in values])
    return {tj.Sum: stack.sum(0), tj.Average: stack.mean(0), tj.Min: stack.min(0),
            tj.Max: stack.max(0), tj.Product: stack.prod(0)}[op]


# Every op for every dtype on an odd count; counts 0 and 1 for every dtype with Sum and Max
# (the other pairs add time, not coverage: the count does not depend on the op).
_ALLREDUCE_CASES = [(dt, op, 7) for dt in FLOAT_DTYPES + INT_DTYPES
                    for op in (tj.Sum, tj.Average, tj.Min, tj.Max, tj.Product)] + \
                   [(dt, op, n) for dt in FLOAT_DTYPES + INT_DTYPES for op in (tj.Sum, tj.Max)
                    for n in (0, 1)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype,op,count", _ALLREDUCE_CASES)
def test_allreduce(mode, dtype, count, op, rank):
    if op == tj.Average and dtype in INT_DTYPES:
        pytest.skip("Average of integers is Horovod's integer division; covered by Sum")
    x = rank_values(rank, (count,), dtype)
    out = run(mode, functools.partial(tj.allreduce, op=op), x)
    assert out.dtype == x.dtype and out.shape == x.shape
    want = expected_reduce(all_rank_values((count,), dtype), op)
    np.testing.assert_allclose(f64(out), want, rtol=1e-2 if dtype in FLOAT_DTYPES[:2] else 1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_bool_and_scalar(mode, rank, size):
    x = rank_values(rank, (5,), jnp.bool_)
    out = run(mode, functools.partial(tj.allreduce, op=tj.Max), x)
    assert out.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(out),
                                  np.any(np.stack(all_rank_values((5,), jnp.bool_)), 0))
    s = run(mode, functools.partial(tj.allreduce, op=tj.Sum), jnp.float32(rank + 1))
    assert s.shape == () and float(s) == size * (size + 1) / 2


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scales(mode, rank, size):
    x = jnp.arange(3, dtype=jnp.float32) + rank
    out = run(mode, functools.partial(tj.allreduce, op=tj.Sum, prescale_factor=2.0,
                                      postscale_factor=0.5), x)
    np.testing.assert_allclose(np.asarray(out),
                               sum(np.arange(3) + r for r in range(size)), rtol=1e-6)
    out = run(mode, functools.partial(tj.allreduce, op=tj.Average, postscale_factor=3.0), x)
    np.testing.assert_allclose(np.asarray(out),
                               3 * np.mean([np.arange(3) + r for r in range(size)], 0))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce(mode, rank, size):
    xs = [rank_values(rank, (n,), dt) for n, dt in [(0, jnp.float32), (1, jnp.float64),
                                                      (7, jnp.int32), (3, jnp.bfloat16)]]
    outs = run(mode, functools.partial(tj.grouped_allreduce, op=tj.Sum), xs)
    assert len(outs) == 4
    for x, out, (n, dt) in zip(xs, outs, [(0, jnp.float32), (1, jnp.float64), (7, jnp.int32),
                                          (3, jnp.bfloat16)]):
        assert out.dtype == x.dtype
        np.testing.assert_allclose(f64(out), expected_reduce(all_rank_values((n,), dt), tj.Sum))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_broadcast(mode, dtype, count, rank, size):
    root = size - 1
    x = rank_values(rank, (count, 2), dtype)
    out = run(mode, functools.partial(tj.broadcast, root_rank=root), x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(f64(out), f64(all_rank_values((count, 2), dtype)[root]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_allgather_uneven(mode, dtype, rank, size):
    # rank r contributes r rows (rank 0 none), and a rank with 1 and an odd number
    x = rank_values(rank, (rank * 2 + (rank == 0) * 0, 3), dtype)
    out = run(mode, tj.allgather, x)
    want = np.concatenate([np.asarray(rank_values(r, (r * 2, 3), dtype)) for r in range(size)])
    assert out.shape == want.shape and out.dtype == x.dtype
    np.testing.assert_array_equal(f64(out), want.astype(np.float64))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", COUNTS)
def test_allgather_counts(mode, rows, rank, size):
    x = rank_values(rank, (rows,), jnp.int64)
    out = run(mode, tj.allgather, x)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.concatenate(all_rank_values((rows,), jnp.int64)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_alltoall(mode, dtype, rank, size):
    # rank r sends r + i + 1 rows to rank i
    splits = [rank + i + 1 for i in range(size)]
    x = rank_values(rank, (sum(splits), 2), dtype)
    out, recv = run(mode, functools.partial(tj.alltoall, splits=splits), x)
    parts = []
    for r in range(size):
        theirs = [r + i + 1 for i in range(size)]
        start = sum(theirs[:rank])
        parts.append(np.asarray(rank_values(r, (sum(theirs), 2), dtype))[
            start:start + theirs[rank]])
    np.testing.assert_array_equal(np.asarray(recv), [r + rank + 1 for r in range(size)])
    np.testing.assert_array_equal(f64(out), np.concatenate(parts).astype(np.float64))
    even = run(mode, tj.alltoall, jnp.arange(2 * size, dtype=jnp.float32) + 100 * rank)
    np.testing.assert_array_equal(np.asarray(even),
                                  [100 * r + 2 * rank + k for r in range(size) for k in (0, 1)])


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_empty(mode, rank, size):
    # nothing sent to anyone, and a rank that receives rows from only one peer
    out, recv = run(mode, functools.partial(tj.alltoall, splits=[0] * size),
                    jnp.zeros((0, 2), jnp.float64))
    assert out.shape == (0, 2) and out.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(recv), [0] * size)
    splits = [1 if (rank == 0 and i == size - 1) else 0 for i in range(size)]
    out, recv = run(mode, functools.partial(tj.alltoall, splits=splits),
                    jnp.full((sum(splits),), 5, jnp.int32))
    want = [5] if rank == size - 1 else []
    np.testing.assert_array_equal(np.asarray(out), np.array(want, dtype=np.int32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
@pytest.mark.parametrize("rows", [0, 1, 7])
def test_reducescatter(mode, dtype, rows, rank, size):
    x = rank_values(rank, (rows, 2), dtype)
    out = run(mode, functools.partial(tj.reducescatter, op=tj.Sum), x)
    full = expected_reduce(all_rank_values((rows, 2), dtype), tj.Sum)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert out.shape == (counts[rank], 2)
    np.testing.assert_allclose(f64(out), full[start:start + counts[rank]], rtol=1e-3)


def test_barrier_join_objects(rank, size):
    tj.barrier()
    assert tj.join() in range(size)
    assert tj.broadcast_object({"from": rank, "list": [1, 2]}, root_rank=0) == \
        {"from": 0, "list": [1, 2]}
    assert tj.allgather_object(("r", rank)) == [("r", r) for r in range(size)]


def test_object_collectives_edge_cases(rank, size):
    # None, empty containers and b"" pickle to a few bytes; ranks' objects differ in size.
    last = size - 1
    assert tj.broadcast_object(None, root_rank=0) is None
    assert tj.broadcast_object(b"" if rank == last else "not root", root_rank=last) == b""
    assert tj.broadcast_object([] if rank == 0 else {"x": 1}, root_rank=0) == []
    assert tj.allgather_object(None) == [None] * size
    mixed = [None if r % 2 == 0 else list(range(r * 100)) for r in range(size)]
    assert tj.allgather_object(mixed[rank]) == mixed
    assert tj.allgather_object({}) == [{}] * size
    big = np.arange(1 << 16, dtype=np.float32) + rank  # a 256 KiB payload
    got = tj.broadcast_object(big, root_rank=last)
    np.testing.assert_array_equal(got, np.arange(1 << 16, dtype=np.float32) + last)
    with pytest.raises(tj.TuttiError):
        tj.broadcast_object(None, root_rank=size)


def test_topology(rank, size):
    assert 0 <= rank < size
    assert 0 <= tj.local_rank() < tj.local_size() <= size
    assert 0 <= tj.cross_rank() < tj.cross_size()


@pytest.mark.parametrize("mode", MODES)
def test_process_set(mode, rank, size):
    """A set of the even ranks: its members reduce among themselves only."""
    members = list(range(0, size, 2))
    if size == 1:  # every rank: a second set of them is refused, as in Horovod
        with pytest.raises(ValueError, match="are those of the global process set 0"):
            tj.add_process_set(members)
        return
    ps = tj.add_process_set(members)
    try:
        if rank in members:
            out = run(mode, functools.partial(tj.allreduce, op=tj.Sum, process_set=ps),
                      jnp.full(3, float(rank + 1)))
            np.testing.assert_allclose(np.asarray(out), sum(r + 1 for r in members))
            g = run(mode, functools.partial(tj.allgather, process_set=ps),
                    jnp.full((1,), rank, jnp.int32))
            np.testing.assert_array_equal(np.asarray(g), members)
    finally:
        tj.barrier()
        tj.remove_process_set(ps)


@pytest.mark.parametrize("mode", MODES)
def test_process_set_object(mode, rank, size):
    """Horovod's ProcessSet objects: the odd ranks (at 1 rank, [0]: every rank, refused)."""
    assert tj.global_process_set.process_set_id == 0
    assert tj.global_process_set.size() == size and tj.global_process_set.rank() == rank
    members = list(range(1, size, 2)) or [0]
    ps = tj.ProcessSet(reversed(members))
    assert ps.ranks == members and ps.size() is None and ps.included() is None
    with pytest.raises(ValueError, match="not registered"):
        tj.allreduce(jnp.ones(2), process_set=ps)
    if size == 1:  # every rank: a second set of them is refused, as in Horovod
        with pytest.raises(ValueError, match="are those of the global process set 0"):
            tj.add_process_set(ps)
        return
    assert tj.add_process_set(ps) is ps and ps.process_set_id > 0
    try:
        with pytest.raises(ValueError, match="already registered"):
            tj.add_process_set(ps)
        assert ps.size() == len(members) and ps.included() == (rank in members)
        assert ps.rank() == (members.index(rank) if rank in members else -1)
        if ps.included():
            out = run(mode, functools.partial(tj.allreduce, op=tj.Sum, process_set=ps),
                      jnp.full(2, float(rank)))
            np.testing.assert_allclose(np.asarray(out), float(sum(members)))
            # root_rank is a global rank, as in tutti.torch and tutti.tensorflow
            assert tj.broadcast_object(rank, root_rank=members[-1], process_set=ps) == \
                members[-1]
            out = run(mode, functools.partial(tj.broadcast, root_rank=members[-1],
                                              process_set=ps), jnp.full(2, float(rank)))
            np.testing.assert_allclose(np.asarray(out), float(members[-1]))
            if 0 not in members:
                with pytest.raises(ValueError, match="root_rank 0 is not in the process set"):
                    tj.broadcast(jnp.ones(2), 0, process_set=ps)
        assert int(run(mode, functools.partial(tj.allreduce, op=tj.Sum,
                                               process_set=tj.global_process_set),
                       jnp.int32(1))) == size
    finally:
        tj.barrier()
        tj.remove_process_set(ps)
    assert ps.process_set_id is None and ps.size() is None
    with pytest.raises(ValueError, match="ProcessSet or an integer id"):
        tj.allreduce(jnp.ones(2), process_set="evens")


def test_join_contributes_zeros(rank, size):
    """Rank 0 joins at once; the others allreduce (Sum) once more, rank 0 adding zeros."""
    if rank != 0:
        out = tj.allreduce(jnp.ones(2), op=tj.Sum, name="join.extra")
        np.testing.assert_allclose(np.asarray(out), size - 1)
    assert tj.join() in range(size)
