"""Correctness of every collective per dtype, shape and op, against values computed here
from every rank's (deterministic) input."""

import pytest
import torch

import tutti.torch as hvd
from conftest import ALL_DTYPES, all_rank_values, rank_values

SHAPES = [(), (1,), (17,), (3, 5), (2, 3, 4)]
REDUCE_OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def reference_reduce(tensors, op, dtype):
    """What the runtime must return: computed in float64, then cast back."""
    stack = torch.stack([t.to(torch.float64) for t in tensors])
    if op == hvd.Sum:
        out = stack.sum(0)
    elif op == hvd.Average:
        out = stack.sum(0)
        if dtype.is_floating_point:
            out = out / len(tensors)
        else:
            out = torch.div(out, len(tensors), rounding_mode="trunc")
    elif op == hvd.Min:
        out = stack.min(0).values
    elif op == hvd.Max:
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return out.to(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_allreduce_dtypes_ops(dtype, op, rank):
    for i, shape in enumerate(SHAPES):
        tensor = rank_values(rank, shape, dtype)
        out = hvd.allreduce(tensor, name="ar.%s.%d.%d" % (dtype, op, i), op=op)
        expected = reference_reduce(all_rank_values(shape, dtype), op, dtype)
        assert out.dtype == dtype and out.shape == tensor.shape
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(out.to(torch.float64), expected.to(torch.float64), atol=tol), \
            (shape, out, expected)
        # The input is left untouched.
        assert torch.equal(tensor, rank_values(rank, shape, dtype))


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 5, 1023, 1024, 1025])
def test_allreduce_odd_counts(count, rank, size):
    tensor = torch.arange(count, dtype=torch.float32) + rank
    out = hvd.allreduce(tensor, name="ar.count.%d" % count, op=hvd.Sum)
    expected = torch.arange(count, dtype=torch.float32) * size + sum(range(size))
    assert torch.equal(out, expected)


def test_allreduce_default_is_average(rank, size):
    tensor = torch.full((4,), float(rank))
    out = hvd.allreduce(tensor, name="ar.default")
    assert torch.allclose(out, torch.full((4,), sum(range(size)) / size))


def test_allreduce_average_argument_deprecated(rank, size):
    tensor = torch.full((3,), float(rank + 1))
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(tensor, average=False, name="ar.average_arg")
    assert torch.allclose(out, torch.full((3,), float(sum(range(1, size + 1)))))
    with pytest.raises(ValueError):
        hvd.allreduce(tensor, average=True, op=hvd.Sum, name="ar.average_and_op")


def test_allreduce_bool(rank, size):
    tensor = torch.tensor([True, False, rank == 0, rank % 2 == 1])
    out_or = hvd.allreduce(tensor, name="ar.bool.sum", op=hvd.Sum)
    out_and = hvd.allreduce(tensor, name="ar.bool.min", op=hvd.Min)
    assert out_or.tolist() == [True, False, True, size > 1]
    assert out_and.tolist() == [True, False, size == 1, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
def test_allreduce_scale_factors(dtype, rank, size):
    tensor = torch.full((5,), rank + 1, dtype=dtype)
    out = hvd.allreduce(tensor, name="ar.scale.%s" % dtype, op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5 if dtype.is_floating_point else 3.0)
    total = sum(range(1, size + 1))
    expected = total * 2.0 * (0.5 if dtype.is_floating_point else 3.0)
    assert torch.allclose(out.to(torch.float64), torch.full((5,), expected, dtype=torch.float64))


def test_allreduce_in_place_and_async(rank, size):
    tensor = torch.full((6,), float(rank))
    handle = hvd.allreduce_async_(tensor, name="ar.inplace", op=hvd.Sum)
    assert isinstance(hvd.poll(handle), bool)
    out = hvd.synchronize(handle)
    assert out is tensor
    assert torch.equal(tensor, torch.full((6,), float(sum(range(size)))))
    tensor2 = torch.full((6,), float(rank))
    result = hvd.allreduce_(tensor2, name="ar.inplace2", op=hvd.Max)
    assert result is tensor2 and torch.equal(tensor2, torch.full((6,), float(size - 1)))
    handle = hvd.allreduce_async(torch.ones(2), name="ar.async", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(size)))
    with pytest.raises(ValueError, match="already synchronized handle %d" % int(handle)):
        hvd.synchronize(handle)  # a second wait is the caller's mistake, never a None result
    with pytest.raises(ValueError, match="unknown or already synchronized handle 987654"):
        hvd.synchronize(987654)


def test_allreduce_non_contiguous(rank, size):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + rank
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    out = hvd.allreduce(view, name="ar.noncontig", op=hvd.Sum)
    expected = (torch.arange(24, dtype=torch.float32).reshape(4, 6) * size
                + sum(range(size))).t()
    assert torch.equal(out, expected)
    hvd.allreduce_(view, name="ar.noncontig.inplace", op=hvd.Sum)
    assert torch.equal(base.t(), expected)


def test_many_async_allreduces_in_flight(rank, size):
    tensors = [torch.full((i + 1,), float(rank * i)) for i in range(40)]
    handles = [hvd.allreduce_async(t, name="ar.many.%d" % i, op=hvd.Sum)
               for i, t in enumerate(tensors)]
    for i, handle in reversed(list(enumerate(handles))):
        out = hvd.synchronize(handle)
        assert torch.equal(out, torch.full((i + 1,), float(i * sum(range(size)))))


def test_unnamed_ops_in_the_same_order(rank, size):
    for i in range(5):
        out = hvd.allreduce(torch.full((3,), float(i + rank)), op=hvd.Sum)
        assert torch.equal(out, torch.full((3,), float(i * size + sum(range(size)))))


@pytest.mark.parametrize("dtype", ALL_DTYPES + [torch.bool])
def test_grouped_allreduce(dtype, rank, size):
    shapes = [(3,), (2, 2), (), (0,), (5, 1)]
    tensors = [rank_values(rank, s, dtype) for s in shapes]
    op = hvd.Max
    outs = hvd.grouped_allreduce(tensors, name="gar.%s" % dtype, op=op)
    assert len(outs) == len(shapes)
    for s, out in zip(shapes, outs):
        assert torch.equal(out, reference_reduce(all_rank_values(s, dtype), op, dtype))
    in_place = [t.clone() for t in tensors]
    result = hvd.grouped_allreduce_(in_place, name="gar_.%s" % dtype, op=op)
    for s, t, r in zip(shapes, in_place, result):
        assert r is t and torch.equal(t, reference_reduce(all_rank_values(s, dtype), op, dtype))


def test_grouped_allreduce_scaled(rank, size):
    """A group's tensors (one of them empty) reduced in one batch with both scale factors,
    out of place (inputs untouched) and in place, with Sum and Average."""
    def make():
        return [torch.full((n,), float(rank + 1 + i), dtype=torch.float64)
                for i, n in enumerate((3, 0, 5, 1))]
    tensors = make()
    outs = hvd.grouped_allreduce(tensors, name="gar.scaled", op=hvd.Sum, prescale_factor=2.0,
                                 postscale_factor=0.25)
    for i, (t, out) in enumerate(zip(tensors, outs)):
        total = sum(r + 1 + i for r in range(size))
        assert torch.equal(out, torch.full_like(t, total * 2.0 * 0.25)), (i, out)
        assert torch.equal(t, torch.full_like(t, float(rank + 1 + i)))
    in_place = make()
    result = hvd.grouped_allreduce_(in_place, name="gar_.scaled", op=hvd.Average,
                                    prescale_factor=0.5, postscale_factor=3.0)
    for i, t in enumerate(in_place):
        average = sum(r + 1 + i for r in range(size)) / size
        assert result[i] is t
        assert torch.allclose(t, torch.full_like(t, average * 0.5 * 3.0)), (i, t)


def test_grouped_allreduce_async(rank, size):
    tensors = [torch.full((i + 2,), float(rank)) for i in range(3)]
    handle = hvd.grouped_allreduce_async(tensors, name="gar.async", op=hvd.Sum)
    outs = hvd.synchronize(handle)
    for i, out in enumerate(outs):
        assert torch.equal(out, torch.full((i + 2,), float(sum(range(size)))))
    handle = hvd.grouped_allreduce_async_(tensors, name="gar.async_", op=hvd.Sum)
    hvd.synchronize(handle)
    for i, t in enumerate(tensors):
        assert torch.equal(t, torch.full((i + 2,), float(sum(range(size)))))


@pytest.mark.parametrize("dtype", ALL_DTYPES + [torch.bool])
def test_allgather_variable_rows(dtype, rank, size):
    for dims in [(), (3,), (2, 4)]:
        rows = [(r % 3) + (1 if dims else 0) for r in range(size)]  # includes 0 rows
        tensor = rank_values(rank, (rows[rank],) + dims, dtype)
        out = hvd.allgather(tensor, name="ag.%s.%d" % (dtype, len(dims)))
        expected = torch.cat([rank_values(r, (rows[r],) + dims, dtype) for r in range(size)])
        assert out.dtype == dtype and torch.equal(out, expected)


def test_allgather_async_and_non_contiguous(rank, size):
    tensor = (torch.arange(6, dtype=torch.int64).reshape(2, 3) + 10 * rank).t()
    out = hvd.synchronize(hvd.allgather_async(tensor, name="ag.async"))
    expected = torch.cat([(torch.arange(6).reshape(2, 3) + 10 * r).t() for r in range(size)])
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES + [torch.bool])
def test_broadcast_every_root(dtype, rank, size):
    for root in range(size):
        for shape in [(), (7,), (2, 3)]:
            tensor = rank_values(rank, shape, dtype)
            name = "bc.%s.%d.%d" % (dtype, root, len(shape))
            out = hvd.broadcast(tensor, root_rank=root, name=name)
            assert torch.equal(out, rank_values(root, shape, dtype))
            assert torch.equal(tensor, rank_values(rank, shape, dtype))  # untouched
            hvd.broadcast_(tensor, root_rank=root, name=name + ".inplace")
            assert torch.equal(tensor, rank_values(root, shape, dtype))


def test_broadcast_async_non_contiguous(rank, size):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    handle = hvd.broadcast_async_(base.t(), root_rank=size - 1, name="bc.noncontig")
    hvd.synchronize(handle)
    assert torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(3, 4) * size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool])
def test_alltoall_equal_splits(dtype, rank, size):
    tensor = rank_values(rank, (size * 2, 3), dtype)
    out = hvd.alltoall(tensor, name="a2a.eq.%s" % dtype)
    expected = torch.cat([rank_values(r, (size * 2, 3), dtype)[2 * rank:2 * rank + 2]
                          for r in range(size)])
    assert torch.equal(out, expected)


def test_alltoall_uneven_splits(rank, size):
    # Rank r sends (r + d) % 3 rows to rank d (some of them zero).
    splits = [(rank + d) % 3 for d in range(size)]
    rows = sum(splits)
    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 100 * rank
    out, received = hvd.alltoall(tensor, splits=splits, name="a2a.uneven")
    expected_rows = []
    for src in range(size):
        src_splits = [(src + d) % 3 for d in range(size)]
        start = sum(src_splits[:rank])
        src_tensor = torch.arange(sum(src_splits) * 2, dtype=torch.float32).reshape(-1, 2)
        expected_rows.append(src_tensor[start:start + src_splits[rank]] + 100 * src)
    assert received.dtype == torch.int32
    assert received.tolist() == [(src + rank) % 3 for src in range(size)]
    assert torch.equal(out, torch.cat(expected_rows))
    out2, received2 = hvd.synchronize(hvd.alltoall_async(tensor, torch.tensor(splits),
                                                         name="a2a.uneven.async"))
    assert torch.equal(out2, out) and torch.equal(received2, received)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("rows_extra", [-1, 0, 1])
def test_reducescatter(op, rows_extra, rank, size):
    rows = max(size * 2 + rows_extra, 0)
    dtype = torch.float32
    tensors = [rank_values(r, (rows, 3), dtype) for r in range(size)]
    out = hvd.reducescatter(tensors[rank], name="rs.%d.%d" % (op, rows_extra), op=op)
    reduced = reference_reduce(tensors, op, dtype)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert torch.allclose(out, reduced[start:start + counts[rank]])


def test_reducescatter_default_average_and_scale(rank, size):
    tensor = torch.full((size * 3,), float(rank + 1), dtype=torch.float64)
    out = hvd.synchronize(hvd.reducescatter_async(tensor, name="rs.default",
                                                  prescale_factor=2.0, postscale_factor=3.0))
    average = sum(range(1, size + 1)) / size
    assert torch.allclose(out, torch.full((3,), 6.0 * average, dtype=torch.float64))


def test_poll_then_synchronize(rank, size):
    handle = hvd.allreduce_async(torch.ones(1000), name="poll.once", op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle), torch.full((1000,), float(size)))
