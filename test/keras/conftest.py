"""Shared setup of the tutti.keras tests on the Keras backend of KERAS_BACKEND (jax or torch;
the TensorFlow backend's are test/tensorflow/test_tf_keras.py). Every rank runs the same tests
in the same order; Tutti is initialized once per process and shut down at the end."""
import os
import sys

# Up to 3 ranks share 2 cores: one compute thread each.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tutti.keras as hvd  # noqa: E402

# Whether importing tutti.keras loaded TensorFlow (Keras' fit may load it later for its data
# adapters; that is Keras', not ours).
TENSORFLOW_AT_IMPORT = "tensorflow" in sys.modules
BACKEND = keras.backend.backend()

if BACKEND == "torch":
    import torch
    torch.set_num_threads(1)

hvd.init()


def pytest_sessionfinish(session, exitstatus):
    hvd.shutdown()


def same_on_every_rank(weights):
    """Asserts that `weights` (a list of arrays) are bit-identical on every rank."""
    flat = np.concatenate([np.ravel(np.asarray(w)) for w in weights]).astype("float64")
    gathered = hvd.allgather_object(flat.tobytes())
    for r, other in enumerate(gathered):
        np.testing.assert_array_equal(np.frombuffer(other, "float64"), flat,
                                      err_msg="rank %d differs from rank %d" % (r, hvd.rank()))
    return flat


def allreduced_tensors():
    """How many tensors this rank has allreduced since init (Tutti's op.allreduce.*.tensors
    counters, over every backend)."""
    if BACKEND == "torch":
        stats = hvd_torch_stats()
    else:
        stats = _c_stats()
    return sum(v for k, v in stats.items()
               if k.startswith("op.allreduce.") and k.endswith(".tensors"))


def hvd_torch_stats():
    import tutti.torch
    return tutti.torch.stats()


def _c_stats():
    import ctypes

    from tutti.jax import _lib

    class Stat(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]

    stats, count = ctypes.POINTER(Stat)(), ctypes.c_int(0)
    assert _lib.lib.tutti_stats(ctypes.byref(stats), ctypes.byref(count)) == 0
    return {stats[i].name.decode(): stats[i].value for i in range(count.value)}


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()
