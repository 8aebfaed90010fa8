"""tutti.tensorflow's collectives against values computed locally: eagerly and inside
tf.function, every reduction, dtype and shape case, and the gradients as Horovod defines them."""

import numpy as np
import pytest
import tensorflow as tf

import tutti.tensorflow as hvd
from conftest import rank_values

DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64]


def _all(shape, dtype):
    return [rank_values(r, shape, dtype) for r in range(hvd.size())]


def _np(t):
    return tf.cast(t, tf.float64).numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_every_dtype(dtype):
    shape = [3, 4]
    out = hvd.allreduce(rank_values(hvd.rank(), shape, dtype), op=hvd.Sum)
    assert out.dtype == dtype and out.shape == shape
    np.testing.assert_allclose(_np(out), sum(_np(t) for t in _all(shape, dtype)))


@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max", "Product"])
def test_allreduce_ops(op):
    values = [_np(t) for t in _all([5], tf.float32)]
    expected = {"Sum": sum(values), "Average": sum(values) / len(values),
                "Min": np.min(values, axis=0), "Max": np.max(values, axis=0),
                "Product": np.prod(values, axis=0)}[op]
    out = hvd.allreduce(rank_values(hvd.rank(), [5], tf.float32), op=getattr(hvd, op))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_allreduce_default_is_average_and_scales():
    x = tf.fill([4], float(hvd.rank() + 1))
    mean = sum(range(1, hvd.size() + 1)) / hvd.size()
    np.testing.assert_allclose(hvd.allreduce(x).numpy(), mean)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_allclose(out.numpy(), sum(range(1, hvd.size() + 1)))


def test_allreduce_adasum_refused():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tf.ones([2]), op=hvd.Adasum)


def test_allreduce_fp16_compression():
    x = tf.fill([8], 0.5 * (hvd.rank() + 1))
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), 0.5 * sum(range(1, hvd.size() + 1)))


def test_allreduce_indexed_slices_as_horovod():
    values = tf.fill([2, 3], float(hvd.rank() + 1))
    slices = tf.IndexedSlices(values, tf.constant([0, hvd.rank() + 1], tf.int64),
                              dense_shape=tf.constant([8, 3], tf.int64))
    out = hvd.allreduce(slices, op=hvd.Average)
    assert isinstance(out, tf.IndexedSlices)
    assert out.values.shape == (2 * hvd.size(), 3)
    expected = np.concatenate([np.full([2, 3], (r + 1) / hvd.size()) for r in range(hvd.size())])
    np.testing.assert_allclose(out.values.numpy(), expected)
    np.testing.assert_array_equal(out.indices.numpy(),
                                  np.concatenate([[0, r + 1] for r in range(hvd.size())]))


def test_allreduce_in_tf_function():
    @tf.function
    def step(x, y):
        return hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(y, op=hvd.Max)

    for i in range(3):
        a, b = step(tf.fill([3], float(hvd.rank() + i)), tf.fill([2], hvd.rank() * 10 + i))
        np.testing.assert_allclose(a.numpy(), sum(r + i for r in range(hvd.size())))
        np.testing.assert_array_equal(b.numpy(), (hvd.size() - 1) * 10 + i)


def test_grouped_allreduce_mixed_dtypes():
    xs = [tf.fill([3], float(hvd.rank())), tf.fill([2, 2], hvd.rank() + 1),
          tf.fill([1], tf.cast(hvd.rank(), tf.float64))]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    n = hvd.size()
    np.testing.assert_allclose(outs[0].numpy(), sum(range(n)))
    np.testing.assert_array_equal(outs[1].numpy(), sum(range(1, n + 1)))
    assert outs[1].dtype == tf.int32 and outs[2].dtype == tf.float64


def test_allgather_uneven_first_dims():
    rows = hvd.rank() + 1
    x = tf.fill([rows, 2], hvd.rank())
    out = hvd.allgather(x)
    expected = np.concatenate([np.full([r + 1, 2], r) for r in range(hvd.size())])
    np.testing.assert_array_equal(out.numpy(), expected)

    @tf.function
    def gathered(t):
        return hvd.allgather(t)

    np.testing.assert_array_equal(gathered(x).numpy(), expected)


def test_allgather_empty_on_one_rank():
    rows = 0 if hvd.rank() == 0 else 2
    out = hvd.allgather(tf.ones([rows, 3]))
    assert out.shape == (2 * (hvd.size() - 1), 3)


def test_broadcast():
    for root in range(hvd.size()):
        x = tf.fill([2, 3], float(hvd.rank() * 7))
        np.testing.assert_allclose(hvd.broadcast(x, root_rank=root).numpy(), root * 7.0)


def test_broadcast_variables_and_objects():
    v = tf.Variable(tf.fill([4], float(hvd.rank())))
    w = tf.Variable(hvd.rank() + 5)
    hvd.broadcast_variables([v, w], root_rank=0)
    np.testing.assert_allclose(v.numpy(), 0.0)
    assert int(w.numpy()) == 5
    obj = hvd.broadcast_object({"rank": hvd.rank(), "x": [1, 2]} if hvd.rank() == 0 else None,
                               root_rank=0)
    assert obj == {"rank": 0, "x": [1, 2]}
    gathered = hvd.allgather_object({"r": hvd.rank(), "pad": "x" * hvd.rank()})
    assert gathered == [{"r": r, "pad": "x" * r} for r in range(hvd.size())]


def test_alltoall_with_splits():
    n = hvd.size()
    # rank r sends (i + 1) rows of value 100*r + i to rank i
    splits = [i + 1 for i in range(n)]
    rows = []
    for i in range(n):
        rows += [100 * hvd.rank() + i] * (i + 1)
    x = tf.constant(rows, dtype=tf.int32)
    out, received = hvd.alltoall(x, splits=splits)
    me = hvd.rank()
    expected = []
    for r in range(n):
        expected += [100 * r + me] * (me + 1)
    np.testing.assert_array_equal(out.numpy(), expected)
    np.testing.assert_array_equal(received.numpy(), [me + 1] * n)


def test_alltoall_equal_splits():
    n = hvd.size()
    x = tf.reshape(tf.range(2 * n) + 10 * hvd.rank(), [2 * n, 1])
    out = hvd.alltoall(x)
    expected = np.concatenate([np.arange(2 * hvd.rank(), 2 * hvd.rank() + 2) + 10 * r
                               for r in range(n)])
    np.testing.assert_array_equal(out.numpy().ravel(), expected)


def test_reducescatter():
    n = hvd.size()
    x = tf.reshape(tf.range(2 * n * 3, dtype=tf.float32), [2 * n, 3]) * (hvd.rank() + 1)
    total = sum(range(1, n + 1))
    out = hvd.reducescatter(x, op=hvd.Sum)
    full = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) * total
    np.testing.assert_allclose(out.numpy(), full[2 * hvd.rank():2 * hvd.rank() + 2])
    avg = hvd.reducescatter(x)  # Average by default, as Horovod
    np.testing.assert_allclose(avg.numpy(), full[2 * hvd.rank():2 * hvd.rank() + 2] / n)


def test_join_and_barrier():
    hvd.barrier()
    last = hvd.join()
    assert 0 <= int(last.numpy()) < hvd.size()


def test_unsupported_dtype_refused():
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)):
        hvd.allreduce(tf.constant(["a"]), op=hvd.Sum)
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)):
        hvd.allreduce(tf.constant([1 + 2j], dtype=tf.complex64), op=hvd.Sum)


# ---- gradients, as Horovod defines them ----

def _grad(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


def test_allreduce_grad():
    x = tf.fill([3], float(hvd.rank()))
    g = _grad(lambda t: hvd.allreduce(t, op=hvd.Sum), x)
    np.testing.assert_allclose(g.numpy(), hvd.size())
    g = _grad(lambda t: hvd.allreduce(t, op=hvd.Average), x)
    np.testing.assert_allclose(g.numpy(), 1.0)


def test_allgather_grad():
    x = tf.fill([hvd.rank() + 1, 2], 1.0)
    g = _grad(lambda t: hvd.allgather(t) * 3.0, x)
    assert g.shape == x.shape
    np.testing.assert_allclose(g.numpy(), 3.0)  # Horovod's definition: averaged, own rows


def test_broadcast_grad():
    x = tf.fill([2], 1.0)
    g = _grad(lambda t: hvd.broadcast(t, root_rank=0), x)
    np.testing.assert_allclose(g.numpy(), 1.0 if hvd.rank() == 0 else 0.0)  # as Horovod


def test_alltoall_grad():
    n = hvd.size()
    x = tf.fill([n, 2], 1.0)
    g = _grad(lambda t: hvd.alltoall(t) * 2.0, x)
    np.testing.assert_allclose(g.numpy(), 2.0)


def test_reducescatter_grad():
    n = hvd.size()
    x = tf.ones([2 * n, 2])
    g = _grad(lambda t: hvd.reducescatter(t, op=hvd.Sum), x)
    np.testing.assert_allclose(g.numpy(), float(n))  # Horovod's definition: allgather * size
    g = _grad(lambda t: hvd.reducescatter(t, op=hvd.Average), x)
    np.testing.assert_allclose(g.numpy(), 1.0)


def test_grouped_allreduce_grad():
    xs = [tf.fill([2], 1.0), tf.fill([3], 2.0)]
    with tf.GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
        loss = tf.reduce_sum(ys[0]) + tf.reduce_sum(ys[1])
    gs = tape.gradient(loss, xs)
    for g in gs:
        np.testing.assert_allclose(g.numpy(), hvd.size())


def test_distributed_gradient_tape_averages():
    w = tf.Variable([1.0, 2.0])
    for fn in (lambda f: f, tf.function):
        def compute():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * float(hvd.rank() + 1))
            tape = hvd.DistributedGradientTape(tape)
            return tape.gradient(loss, [w])

        (g,) = fn(compute)()
        np.testing.assert_allclose(g.numpy(), sum(range(1, hvd.size() + 1)) / hvd.size())


def test_distributed_gradient_tape_sparse_and_local_sources():
    emb = tf.Variable(tf.ones([6, 2]))
    local = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        rows = tf.gather(emb, [hvd.rank()])
        loss = tf.reduce_sum(rows) + local[0] * float(hvd.rank() + 1)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    tape.register_local_source(local)
    g_emb, g_local = tape.gradient(loss, [emb, local])
    assert isinstance(g_emb, tf.IndexedSlices)
    assert g_emb.values.shape[0] == hvd.size()
    np.testing.assert_allclose(g_local.numpy(), (hvd.rank() + 1) / hvd.size())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [hvd.rank()]))
    dense = hvd.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, [emb])[0]
    assert not isinstance(dense, tf.IndexedSlices)
    expected = np.zeros([6, 2])
    expected[:hvd.size()] = 1.0 / hvd.size()
    np.testing.assert_allclose(dense.numpy(), expected)


def test_partial_distributed_gradient_tape_keeps_local_layers_local():
    import keras
    shared, local = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
    x = tf.ones([1, 1])
    shared(x), local(x)
    with tf.GradientTape() as tape:
        loss = (tf.reduce_sum(shared(x)) + tf.reduce_sum(local(x))) * float(hvd.rank() + 1)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=local)
    g_shared, g_local = tape.gradient(loss, [shared.kernel, local.kernel])
    np.testing.assert_allclose(g_shared.numpy(), sum(range(1, hvd.size() + 1)) / hvd.size())
    np.testing.assert_allclose(g_local.numpy(), (hvd.rank() + 1) / hvd.size())
    with tf.GradientTape() as tape:
        loss = (tf.reduce_sum(shared(x)) + tf.reduce_sum(local(x))) * float(hvd.rank() + 1)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    mine, reduced = tape.get_local_and_global_gradients(loss, [shared.kernel, local.kernel])
    assert [v is local.kernel for v, _ in mine] == [True]
    assert [v is shared.kernel for v, _ in reduced] == [True]
    np.testing.assert_allclose(mine[0][1].numpy(), (hvd.rank() + 1) / hvd.size())
    np.testing.assert_allclose(reduced[0][1].numpy(), g_shared.numpy())
    with pytest.raises(ValueError, match="PartialDistributedGradientTape: local_layers must "
                       "be a Keras layer or a list of Keras layers .*; got item 1 of type"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[local, shared.kernel])
    with pytest.raises(ValueError, match="; got an object of type int$"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=3)
