"""Loads tutti.tensorflow's op library, after checking it was built for this TensorFlow.

The op library is compiled against one TensorFlow's headers and C++ ABI; loaded into another
TensorFlow it may crash the interpreter instead of failing. So the version the build recorded
in _build_info.py is compared with tf.__version__ first: a mismatch, a build without
TensorFlow and a missing TensorFlow each raise ImportError naming what was expected, what was
found and the command that rebuilds Tutti. The library itself also reports the version it was
compiled against (tutti_tf_built_version), checked once it is loaded.

`lib` is the op module tf.load_op_library returns (tutti_allreduce, ...); `capi` is a ctypes
handle on the same shared object, through which the lifecycle and topology functions of
libtutti's C API (a dependency of the op library) are called.
"""

import ctypes
import os
import sys

try:
    from tutti.tensorflow import _build_info
except ImportError as e:
    raise ImportError(
        "tutti.tensorflow in %s has no _build_info.py, which the build writes: that is the "
        "source tree; import a built copy (build/python-tensorflow on PYTHONPATH, or an "
        "installed one)" % os.path.dirname(os.path.abspath(__file__))) from e

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tutti_tf_ops.so")


def _rebuild():
    return _build_info.REBUILD.format(python=sys.executable)


def _release(version):
    return version.split("+", 1)[0]


def check(tf_version):
    """Raises ImportError unless TensorFlow `tf_version` is the one the library was built for."""
    built = _build_info.TF_VERSION
    if built is None:
        raise ImportError(
            "tutti.tensorflow is not available: this Tutti was built without TensorFlow (%s). "
            "Install TensorFlow into this environment (e.g. `%s -m pip install "
            "tensorflow-cpu==2.21.0`), then rebuild Tutti so that it compiles the op library "
            "against it: %s" % (_build_info.MISSING, sys.executable, _rebuild()))
    if _release(tf_version) != _release(built):
        raise ImportError(
            "tutti.tensorflow was built against TensorFlow %s (for %s), but %s imports "
            "TensorFlow %s; an op library built for another TensorFlow can crash the "
            "interpreter, so it was not loaded. Rebuild Tutti against TensorFlow %s: %s"
            % (built, _build_info.PYTHON, sys.executable, tf_version, tf_version, _rebuild()))


def load():
    """Returns (op module, ctypes handle of the C API)."""
    import tensorflow as tf
    check(tf.__version__)
    if not os.path.exists(LIBRARY):
        raise ImportError("tutti.tensorflow: the op library %s is missing; rebuild Tutti: %s"
                          % (LIBRARY, _rebuild()))
    ops = tf.load_op_library(LIBRARY)
    capi = ctypes.CDLL(LIBRARY)
    capi.tutti_tf_built_version.restype = ctypes.c_char_p
    compiled = capi.tutti_tf_built_version().decode()
    if _release(compiled) != _release(tf.__version__):
        raise ImportError("tutti.tensorflow's op library was compiled against TensorFlow %s "
                          "but this interpreter imports TensorFlow %s; rebuild Tutti: %s"
                          % (compiled, tf.__version__, _rebuild()))
    for name in ("tutti_rank", "tutti_size", "tutti_local_rank", "tutti_local_size",
                 "tutti_cross_rank", "tutti_cross_size", "tutti_is_initialized",
                 "tutti_process_set_rank", "tutti_process_set_size", "tutti_backend_built"):
        getattr(capi, name).restype = ctypes.c_int
    for name in ("tutti_init", "tutti_shutdown", "tutti_start_timeline", "tutti_stop_timeline",
                 "tutti_add_process_set", "tutti_remove_process_set"):
        getattr(capi, name).restype = ctypes.c_int
    capi.tutti_last_error.restype = ctypes.c_char_p
    capi.tutti_cpu_backend.restype = ctypes.c_char_p
    capi.tutti_status_string.restype = ctypes.c_char_p
    capi.tutti_status_string.argtypes = [ctypes.c_int]
    # Elastic jobs (docs/elastic.md).
    capi.tutti_status_recoverable.restype = ctypes.c_int
    capi.tutti_status_recoverable.argtypes = [ctypes.c_int]
    capi.tutti_hosts_updated.restype = ctypes.c_int
    capi.tutti_hosts_updated.argtypes = [ctypes.POINTER(ctypes.c_int)]
    capi.tutti_elastic_generation.restype = ctypes.c_int64
    capi.tutti_tf_recoverable_marker.restype = ctypes.c_char_p
    return ops, capi
