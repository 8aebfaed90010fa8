"""tutti.tensorflow under XLA (tf.function(jit_compile=True), docs/tensorflow.md "XLA"):
allreduce, grouped_allreduce and broadcast run inside the compiled function as XLA custom
calls; the other ops fail the compilation with Tutti's message on every rank, after which the
next op works. Where the op library was built without its XLA lowering (no highwayhash or
farmhash headers), the lowered ops fail the same way, saying so."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tutti.keras as hk
import tutti.tensorflow as hvd

from conftest import rank_values

_WHAT_TO_DO = ("call the collective outside the XLA-compiled function or use "
               "jit_compile=False (in Keras: model.compile(jit_compile=False))")
_NOT_BUILT = "was built without its XLA lowering"


def _next_op_works():
    out = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="xla.after_error")
    np.testing.assert_allclose(out.numpy(), hvd.size())


def _assert_not_compilable(info, what, name=None):
    """Tutti's sentence reaches the user: the op, its tensor name (any, for name="*"), why,
    and what to do."""
    message = str(info.value)
    op = re.escape(what) + {None: "", "*": " '[^']+'"}.get(name, " '%s'" % re.escape(str(name)))
    pattern = (r"tutti\.tensorflow: %s cannot be compiled by XLA "
               r"\(tf\.function\(jit_compile=True\)\): " % op)
    assert re.search(pattern, message), message
    assert _WHAT_TO_DO in message, message


def _lowered(fn, *args):
    """Runs a jit-compiled function of lowered ops; checks its HLO holds Tutti's custom calls.
    Returns None where the library has no lowering, after checking the message that says so
    (every rank fails the compilation alike)."""
    try:
        out = fn(*args)
    except tf.errors.UnimplementedError as e:
        assert _NOT_BUILT in str(e) and _WHAT_TO_DO in str(e), str(e)
        _next_op_works()
        return None
    hlo = fn.experimental_get_compiler_ir(*args)(stage="hlo")
    assert 'custom_call_target="tutti_tf_' in hlo, hlo
    assert "custom_call_has_side_effect=true" in hlo, hlo
    return out


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.bfloat16])
def test_allreduce_under_xla(dtype):
    @tf.function(jit_compile=True)
    def step(x):
        total = hvd.allreduce(x, op=hvd.Sum, name="xla.sum")
        return total * 2, hvd.allreduce(x, op=hvd.Max, name="xla.max")

    x = rank_values(hvd.rank(), [3, 4], dtype)
    out = _lowered(step, x)
    if out is None:
        return
    per_rank = [rank_values(r, [3, 4], dtype).numpy().astype(np.float64)
                for r in range(hvd.size())]
    for _ in range(2):  # the compiled function runs again without a retrace
        total, biggest = step(x)
        np.testing.assert_allclose(total.numpy().astype(np.float64), 2 * sum(per_rank))
        np.testing.assert_allclose(biggest.numpy().astype(np.float64),
                                   np.max(per_rank, axis=0))


def test_average_and_scalars_under_xla():
    @tf.function(jit_compile=True)
    def step(x, s):
        return (hvd.allreduce(x, op=hvd.Average, name="xla.avg"),
                hvd.allreduce(s, op=hvd.Sum, prescale_factor=0.5, name="xla.scalar"))

    out = _lowered(step, tf.fill([5], float(hvd.rank() + 1)), tf.constant(4.0))
    if out is None:
        return
    avg, scalar = out
    np.testing.assert_allclose(avg.numpy(), (hvd.size() + 1) / 2.0)
    assert scalar.shape == ()
    np.testing.assert_allclose(scalar.numpy(), 2.0 * hvd.size())


def test_grouped_allreduce_and_broadcast_under_xla():
    root = hvd.size() - 1

    @tf.function(jit_compile=True)
    def step(a, b):
        summed = hvd.grouped_allreduce([a, b], op=hvd.Sum)
        return summed[0], summed[1], hvd.broadcast(b, root_rank=root)

    a = tf.fill([3], float(hvd.rank() + 1))
    b = tf.fill([2, 2], hvd.rank() + 10)
    out = _lowered(step, a, b)
    if out is None:
        return
    sum_a, sum_b, bcast = out
    n = hvd.size()
    np.testing.assert_allclose(sum_a.numpy(), n * (n + 1) / 2)
    np.testing.assert_array_equal(sum_b.numpy(), np.full([2, 2], sum(range(10, 10 + n))))
    np.testing.assert_array_equal(bcast.numpy(), np.full([2, 2], root + 10))


def _model():
    tf.keras.utils.set_random_seed(1234)  # the same initial weights on every rank
    return tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                tf.keras.layers.Dense(8, activation="relu"),
                                tf.keras.layers.Dense(1)])


def _train(jit_compile, steps=3):
    model = _model()
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # Every rank its own batch: the weights stay equal only if the gradients are averaged.
    x = tf.cast(rank_values(hvd.rank(), [6, 4], tf.float32), tf.float32) / 3.0
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    if jit_compile:
        step(x, y)  # builds the optimizer's variables outside the compiled trace
        hlo = step.experimental_get_compiler_ir(x, y)(stage="hlo")
        assert 'custom_call_target="tutti_tf_' in hlo, hlo
        steps -= 1
    for _ in range(steps):
        step(x, y)
    return [v.numpy() for v in model.trainable_variables]


def test_gradient_tape_training_step_under_xla():
    try:
        with_xla = _train(jit_compile=True)
    except tf.errors.UnimplementedError as e:
        assert _NOT_BUILT in str(e) and _WHAT_TO_DO in str(e), str(e)
        _next_op_works()
        return
    without = _train(jit_compile=False)
    for w_xla, w in zip(with_xla, without):
        # Identical on every rank, and the training of the graph ops.
        spread = hvd.allreduce(tf.constant(w_xla), op=hvd.Max, name="xla.w.max") - \
            hvd.allreduce(tf.constant(w_xla), op=hvd.Min, name="xla.w.min")
        np.testing.assert_array_equal(spread.numpy(), np.zeros_like(w_xla))
        np.testing.assert_allclose(w_xla, w, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif("hvd.size() < 2")
def test_mismatch_under_xla_errors_on_every_rank():
    @tf.function(jit_compile=True)
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum, name="xla.mismatch")

    with pytest.raises(tf.errors.OpError) as info:
        step(tf.ones([hvd.rank() + 1]))
    message = str(info.value)
    if _NOT_BUILT in message:  # no lowering: the compilation failed, nothing ran
        assert _WHAT_TO_DO in message, message
    else:  # Tutti's negotiation, from inside the compiled function
        assert "allreduce" in message and "xla.mismatch" in message, message
        assert "shape [1] on rank 0 but [2] on rank 1" in message, message
    _next_op_works()


def _run_compiled(call):
    @tf.function(jit_compile=True, autograph=False)
    def fn():
        call()  # no outputs: the stateful op stays in the function all the same

    fn()


@pytest.mark.parametrize("what, call, name", [
    ("allgather", lambda: hvd.allgather(tf.ones([2, 3]), name="xla.gather"), "xla.gather"),
    ("alltoall", lambda: hvd.alltoall(tf.ones([2 * hvd.size(), 3]), name="xla.a2a"),
     "xla.a2a"),
    ("reducescatter",
     lambda: hvd.reducescatter(tf.ones([2 * hvd.size(), 3]), op=hvd.Sum, name="xla.rs"),
     "xla.rs"),
    ("join", lambda: hvd.join(), None),
    ("barrier", lambda: hvd.barrier(), None),
])
def test_ops_without_lowering_fail_with_tuttis_message(what, call, name):
    with pytest.raises(tf.errors.UnimplementedError) as info:
        _run_compiled(call)
    _assert_not_compilable(info, what, name)
    _next_op_works()


def test_sparse_gradient_under_xla_names_allgather():
    emb = tf.Variable(tf.ones([4, 2]))

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(emb, [hvd.rank() % 4]))
        return hvd.DistributedGradientTape(tape).gradient(loss, [emb])[0].values

    with pytest.raises(tf.errors.UnimplementedError) as info:
        step()
    _assert_not_compilable(info, "allgather", "*")
    _next_op_works()

    @tf.function(jit_compile=True)
    def dense_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(emb, [hvd.rank() % 4]))
        return hvd.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, [emb])[0]

    out = _lowered(dense_step)
    if out is not None:
        expected = np.zeros([4, 2])
        for r in range(hvd.size()):
            expected[r % 4] += 1.0 / hvd.size()
        np.testing.assert_allclose(out.numpy(), expected)


_LATE_IMPORT = """
import tensorflow as tf
tf.function(lambda x: x * 2, jit_compile=True)(tf.ones([2]))  # XLA's first compilation
import tutti.tensorflow as hvd
hvd.init()
step = tf.function(lambda x: hvd.allreduce(x, name="late"), jit_compile=True)
try:
    print(step(tf.ones([2])).numpy().tolist())
except tf.errors.UnimplementedError as e:
    print(e)
hvd.shutdown()
"""


@pytest.mark.skipif("hvd.size() > 1")  # a job of its own, in a world of one
def test_xla_kernels_registered_after_xla_compiled_before_the_import():
    out = subprocess.run([sys.executable, "-c", _LATE_IMPORT], capture_output=True, text=True,
                         timeout=240, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last == "[1.0, 1.0]" or (_NOT_BUILT in out.stdout and _WHAT_TO_DO in out.stdout), \
        out.stdout + out.stderr[-3000:]


def test_keras_fit_with_jit_compile_and_no_callback_trains_under_xla():
    """Without tutti.keras' callbacks nothing turns XLA off: the DistributedOptimizer's
    allreduce runs inside Keras' XLA-compiled train function."""
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                  jit_compile=True)
    x = rank_values(hvd.rank(), [16, 4], tf.float32).numpy() / 3.0
    try:
        model.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=2, verbose=0)
    except tf.errors.UnimplementedError as e:
        assert _NOT_BUILT in str(e) and _WHAT_TO_DO in str(e), str(e)
        _next_op_works()
        return
    assert model.jit_compile is True
    w = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    spread = (hvd.allreduce(tf.constant(w), op=hvd.Max, name="xla.keras.max") -
              hvd.allreduce(tf.constant(w), op=hvd.Min, name="xla.keras.min"))
    np.testing.assert_array_equal(spread.numpy(), np.zeros_like(w))
