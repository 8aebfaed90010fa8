"""Drop-in details of horovod.torch that scripts rely on (see docs/pytorch.md,
"Compatibility with horovod.torch"): each test is a difference Tutti once had."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

import tutti.torch as hvd


def test_version_and_not_built_names():
    assert isinstance(hvd.__version__, str) and hvd.__version__
    # Feature detection: a name Tutti does not have is absent to hasattr() and getattr()
    # with a default; using it says what to do instead (an AttributeError that is also a
    # NotImplementedError).
    assert not hasattr(hvd, "mpi_lib")
    assert getattr(hvd, "mpi_lib", None) is None
    with pytest.raises(NotImplementedError, match="docs/pytorch.md"):
        hvd.mpi_lib  # noqa: B018
    with pytest.raises(AttributeError, match="tutti.torch._C"):
        hvd.mpi_lib  # noqa: B018
    for name in ("SyncBatchNorm", "Adasum", "DistributedOptimizer"):
        assert hasattr(hvd, name)
    import tutti
    assert callable(tutti.run)
    # Elastic training's names, where horovod.torch has them (docs/elastic.md).
    from tutti.torch.elastic import HorovodInternalError, HostsUpdatedInterrupt
    assert HorovodInternalError is hvd.HorovodInternalError
    assert HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt
    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler"):
        assert callable(getattr(hvd.elastic, name))
    with pytest.raises(AttributeError):
        hvd.no_such_name  # noqa: B018


def test_error_before_init_names_init():
    code = ("import torch, tutti.torch as hvd\n"
            "for call in (lambda: hvd.rank(), lambda: hvd.allreduce(torch.ones(1))):\n"
            "    try:\n"
            "        call()\n"
            "    except ValueError as e:\n"
            "        assert 'call hvd.init() first' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('no error')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert done.returncode == 0, done.stdout.decode()


def test_horovod_environment_from_tuttirun(rank, size):
    if "TUTTI_RANK" not in os.environ:
        pytest.skip("not launched by tuttirun")
    assert os.environ["HOROVOD_RANK"] == str(rank)
    assert os.environ["HOROVOD_SIZE"] == str(size)
    assert os.environ["HOROVOD_LOCAL_RANK"] == str(hvd.local_rank())
    assert os.environ["HOROVOD_CROSS_SIZE"] == str(hvd.cross_size())


def test_unnamed_grouped_allreduce_all_forms(rank, size):
    def tensors():
        return [torch.full((i + 2,), float(rank + i)) for i in range(3)]

    expected = [torch.full((i + 2,), float(sum(range(size)) + size * i)) for i in range(3)]
    results = [hvd.grouped_allreduce(tensors(), op=hvd.Sum),
               hvd.synchronize(hvd.grouped_allreduce_async(tensors(), op=hvd.Sum)),
               hvd.grouped_allreduce_(tensors(), op=hvd.Sum)]
    in_place = tensors()
    hvd.synchronize(hvd.grouped_allreduce_async_(in_place, op=hvd.Sum))
    results.append(in_place)
    for got in results:
        assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_grouped_allgather_and_reducescatter(rank, size):
    gathered = hvd.grouped_allgather([torch.full((rank + 1,), rank), torch.ones(2, 3) * rank])
    assert gathered[0].tolist() == [r for r in range(size) for _ in range(r + 1)]
    assert torch.equal(gathered[1], torch.cat([torch.ones(2, 3) * r for r in range(size)]))
    handle = hvd.grouped_reducescatter_async([torch.ones(size * 2, 2), torch.ones(size)],
                                             op=hvd.Sum)
    assert hvd.poll(handle) in (True, False)
    first, second = hvd.synchronize(handle)
    assert torch.equal(first, torch.full((2, 2), float(size)))
    assert torch.equal(second, torch.full((1,), float(size)))


def test_prescale_postscale_in_tensor_dtype(rank, size):
    factor = 0.3183098861837907  # not exact in float32: the order of rounding shows
    # Only rank 0 contributes non-zeros, so the sum itself is exact in any order.
    base = torch.arange(-50, 50, dtype=torch.float32)
    tensor = base if rank == 0 else torch.zeros(100)
    got = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor, name="compat.pre")
    assert torch.equal(got, base * torch.tensor(factor, dtype=torch.float32))
    got = hvd.allreduce(tensor, op=hvd.Sum, postscale_factor=factor, name="compat.post")
    assert torch.equal(got, base * torch.tensor(factor, dtype=torch.float32))
    # Average divides (correctly rounded), as Horovod's tests compare exactly.
    got = hvd.allreduce(base * (2 if rank < 2 else 0), name="compat.avg")
    assert torch.equal(got, base * min(size, 2) * 2 / size)


def test_broadcast_object_from_root_only(rank, size):
    for root in range(size):
        obj = {"from": root, "data": list(range(root + 2))} if rank == root else None
        assert hvd.broadcast_object(obj, root_rank=root) == {"from": root,
                                                             "data": list(range(root + 2))}
    values = hvd.allgather_object("r%d" % rank if rank % 2 else rank)
    assert values == ["r%d" % r if r % 2 else r for r in range(size)]


def test_sparse_allreduce_async(rank, size):
    dense = torch.zeros(6, 3)
    dense[rank % 6] = rank + 1.0
    dense[5] = 1.0
    reduced = hvd.sparse_allreduce_async(dense.to_sparse(), name="compat.sparse",
                                         op=hvd.Sum)()
    assert reduced.is_sparse
    assert torch.equal(reduced.to_dense(), hvd.allreduce(dense, op=hvd.Sum))


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_optimizer(sparse_as_dense, rank, size):
    torch.manual_seed(7)
    model = torch.nn.Embedding(10, 3, sparse=True)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
        named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    indices = torch.tensor([[1, 2, 4 + rank % 3]])
    optimizer.zero_grad()
    model(indices).sum().backward()
    optimizer.step()
    weights = hvd.allgather(model.weight.detach().unsqueeze(0))
    assert all(torch.equal(weights[0], w) for w in weights)


def test_synchronize_warning_wording(rank, size):
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    assert any("optimizer.step() called without optimizer.skip_synchronize()"
               in str(w.message) for w in caught)


def test_init_comm_list_and_mpi4py(rank, size):
    hvd.init(comm=list(range(size)))  # the whole job: accepted
    if size > 1:
        with pytest.raises(NotImplementedError, match="add_process_set"):
            hvd.init(comm=[0])
    if hvd.cpu_backend() != "mpi":
        pytest.skip("mpi4py communicators need the MPI backend (run under mpirun)")
    MPI = pytest.importorskip("mpi4py.MPI")
    hvd.init(comm=MPI.COMM_WORLD)
    assert hvd.rank() == MPI.COMM_WORLD.Get_rank()
    if size > 1:
        half = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
        with pytest.raises(NotImplementedError, match="process"):
            hvd.init(comm=half)
        half.Free()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_errors_are_horovod_internal_errors(rank, size):
    for cls in (hvd.TuttiError, hvd.TuttiValueError, hvd.DuplicateNameError,
                hvd.TuttiTimeoutError):
        assert issubclass(cls, hvd.HorovodInternalError) and issubclass(cls, RuntimeError)
    if size > 1:
        with pytest.raises(hvd.HorovodInternalError, match="compat.err"):
            hvd.allreduce(torch.ones(2 + rank), name="compat.err")
