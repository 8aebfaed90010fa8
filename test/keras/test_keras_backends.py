"""tutti.keras on Keras 3's jax and torch backends (KERAS_BACKEND): model.fit on every rank
ends with identical weights, the gradients are averaged before they are applied,
backward_passes_per_step, the callbacks, and the import errors."""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import tutti.keras as hvd
from conftest import BACKEND, TENSORFLOW_AT_IMPORT, allreduced_tensors, same_on_every_rank


def _model(seed):
    keras.utils.set_random_seed(seed)  # a different start on every rank
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])


def _data(seed, n=32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")


def _linear():
    """One weight, starting at zero: with loss sum(p * y) and x = 1, its gradient is y."""
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                                   kernel_initializer="zeros")])


def _dot_loss(y, p):
    return keras.ops.sum(p * y)


def test_backend_and_no_tensorflow():
    assert BACKEND in ("jax", "torch")
    assert not TENSORFLOW_AT_IMPORT, "importing tutti.keras loaded TensorFlow"


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_fit_ends_with_identical_weights(optimizer):
    model = _model(seed=100 + hvd.rank())
    base = getattr(keras.optimizers, optimizer)(learning_rate=0.01)
    opt = hvd.DistributedOptimizer(base)
    assert isinstance(opt, type(base))
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(seed=hvd.rank())
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    same_on_every_rank(model.get_weights())
    same_on_every_rank([v.numpy() if hasattr(v, "numpy") else keras.ops.convert_to_numpy(v)
                        for v in model.optimizer.variables])
    # MetricAverageCallback: every rank reports the same averaged loss.
    same_on_every_rank([history.history["loss"]])


def test_broadcast_makes_every_rank_start_from_the_root():
    """Learning rate 0: the weights after fit are rank 0's initial ones."""
    model = _model(seed=200 + hvd.rank())
    root_start = hvd.broadcast_object([np.asarray(w) for w in model.get_weights()], 0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x, y = _data(seed=hvd.rank(), n=8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for w, r in zip(model.get_weights(), root_start):
        np.testing.assert_array_equal(w, r)


@pytest.mark.parametrize("jit_compile", [True, False] if BACKEND == "jax" else [False])
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_gradients_are_averaged_before_apply(jit_compile, compression):
    # One SGD step with lr 1 from zero weights: the update is minus the mean gradient.
    model = _linear()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                   compression=getattr(hvd.Compression, compression))
    model.compile(optimizer=opt, loss=_dot_loss, jit_compile=jit_compile)
    x = np.ones((1, 1), "float32")
    y = np.full((1, 1), float(hvd.rank() + 1), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0)
    expected = -sum(range(1, hvd.size() + 1)) / hvd.size()
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [expected], rtol=1e-6)


def test_gradients_are_reduced_before_clipping():
    # Gradients 1..n over the ranks, clipped at a value above their mean and below the
    # largest: reduced first, the update is the mean, unclipped.
    n = hvd.size()
    mean = (n + 1) / 2.0
    model = _linear()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0, clipvalue=mean + 0.25))
    model.compile(optimizer=opt, loss=_dot_loss)
    model.fit(np.ones((1, 1), "float32"), np.full((1, 1), float(hvd.rank() + 1), "float32"),
              batch_size=1, epochs=1, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [-mean], rtol=1e-6)


@pytest.mark.parametrize("jit_compile", [True, False] if BACKEND == "jax" else [False])
@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_per_step_reduces_once_per_steps(average, jit_compile):
    model = _linear()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss=_dot_loss, jit_compile=jit_compile)
    x = np.ones((4, 1), "float32")
    y = np.full((4, 1), float(hvd.rank() + 1), "float32")
    before = allreduced_tensors()
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, shuffle=False)
    # Four batches, two updates, each of two local gradients of rank+1 (summed, or averaged
    # with average_aggregated_gradients), then averaged over the ranks.
    per_update = (1 if average else 2) * sum(range(1, hvd.size() + 1)) / hvd.size()
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [-2 * per_update], rtol=1e-6)
    same_on_every_rank(model.get_weights())
    if hvd.size() > 1:  # one gradient, reduced on the two update steps only
        assert allreduced_tensors() - before == 2


def test_learning_rate_warmup_per_batch():
    model = _model(seed=7)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = _data(seed=1, n=16)
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2,
                                                      steps_per_epoch=2)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), warmup]
    if BACKEND == "torch":  # (on jax the variables are emptied during fit)
        callbacks.append(record)
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=callbacks)
    n = hvd.size()
    # Horovod's formula at batch b of epoch e: epoch = e + b/2 + 1/2.
    expected = [0.1 / n * ((e + b / 2 + 0.5) * (n - 1) / 2 + 1) for e in (0, 1) for b in (0, 1)]
    lrs = history.history["lr"]
    np.testing.assert_allclose(lrs[0], expected[1], rtol=1e-5)
    np.testing.assert_allclose(lrs[-1], lrs[1], rtol=1e-5)  # no change after warmup
    if BACKEND == "torch":
        np.testing.assert_allclose(seen[:4], expected, rtol=1e-5)
    same_on_every_rank(model.get_weights())


def test_learning_rate_schedule_staircase():
    model = _model(seed=8)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = _data(seed=2, n=8)
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch, start_epoch=1)
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[schedule])
    np.testing.assert_allclose(history.history["lr"], [0.1, 0.05, 0.025], rtol=1e-6)


def test_load_model_wraps_the_saved_optimizer(tmp_path):
    model = _model(seed=21)  # the same start on every rank
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = _data(seed=hvd.rank(), n=16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    path = str(tmp_path / ("model_rank%d.keras" % hvd.rank()))
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert loaded.optimizer._tutti_distributed
    assert int(keras.ops.convert_to_numpy(loaded.optimizer.iterations)) == 2
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The loaded optimizer reduces: rank-specific data, the same weights on every rank.
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    same_on_every_rank(loaded.get_weights())


def test_wraps_only_keras_optimizers():
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)


def test_import_errors():
    """Keras 2 without tutti.tensorflow, a backend tutti.keras does not run on, and a
    backend whose adapter is not built: `import tutti.keras` raises ImportError naming what
    is missing (in a fresh interpreter, once per job)."""
    if hvd.rank() != 0:
        pytest.skip("once per job, on rank 0")
    adapter = "tutti.jax" if BACKEND == "jax" else "tutti.torch"
    code = """
import sys
import keras

def attempt(what):
    try:
        import tutti.keras  # noqa: F401
    except ImportError as e:
        print(what, e)
    else:
        print(what, "imported")

version, keras.__version__ = keras.__version__, "2.15.0"
attempt("keras2:")
keras.__version__ = version
backend, keras.backend.backend = keras.backend.backend, lambda: "numpy"
attempt("numpy:")
keras.backend.backend = backend
sys.modules[%r] = None
attempt("adapter:")
""" % adapter
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    for var in list(env):  # a plain process, not a rank of this job
        if var.startswith(("TUTTI_", "OMPI_", "PMIX_")):
            del env[var]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    # Keras 2 runs on TensorFlow only: here, without tutti.tensorflow on the path.
    assert "keras2: tutti.keras on Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) needs Tutti's " \
           "tutti.tensorflow adapter" in out, out
    assert "numpy: tutti.keras runs Keras 3 on the jax, tensorflow, torch backends; this " \
           "Keras uses the 'numpy' backend" in out, out
    assert ("adapter: tutti.keras on the Keras %r backend needs Tutti's %s adapter, which "
            "does not import here" % (BACKEND, adapter)) in out, out
