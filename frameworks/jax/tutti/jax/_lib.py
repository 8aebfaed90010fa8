"""libtutti_jax.so through ctypes: Tutti's C API for what runs outside jax.jit (init, topology,
eager collectives on host arrays, barrier, join, object collectives, the shape exchanges done
at trace time) and the XLA FFI handlers registered with jax.ffi for what runs inside it.

The library links libtutti; ctypes looks the C API's symbols up through it, so libtutti is the
one the build linked (found through the library's RPATH).
"""
import ctypes
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_PATH = os.path.join(_HERE, "libtutti_jax.so")

if not os.path.exists(_PATH):
    raise ImportError(
        "tutti.jax has no %s: this Tutti was built without jax. Install jax into the "
        "environment first (e.g. `pip install jax==0.10.2`), then rebuild Tutti (pip install ., "
        "or cmake with -DTUTTI_WITH_JAX=ON; docs/jax.md)" % _PATH)

MAX_DIMS = 8

# tutti_status_t
OK = 0
ERR_MISMATCH = 2
ERR_TIMEOUT = 3
ERR_NOT_INITIALIZED = 5
ERR_JOINED = 9

# tutti_dtype_t by numpy dtype name (bfloat16 is ml_dtypes', which jax uses).
DTYPES = {
    "uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "int32": 4, "int64": 5,
    "float16": 6, "bfloat16": 7, "float32": 8, "float64": 9, "bool": 10,
}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS)]


class OpOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("op", ctypes.c_int),
                ("prescale", ctypes.c_double), ("postscale", ctypes.c_double),
                ("root", ctypes.c_int), ("process_set", ctypes.c_int),
                ("splits", ctypes.POINTER(ctypes.c_int64)), ("nsplits", ctypes.c_int),
                ("callback", ctypes.c_void_p), ("user_data", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p), ("release", ctypes.c_void_p),
                ("device", ctypes.c_int)]


class Result(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_int64), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS),
                ("recv_splits", ctypes.POINTER(ctypes.c_int64)), ("nsplits", ctypes.c_int),
                ("last_joined_rank", ctypes.c_int)]


lib = ctypes.CDLL(_PATH, mode=ctypes.RTLD_GLOBAL)

_I64P = ctypes.POINTER(ctypes.c_int64)
for _name, _res, _args in [
        ("tutti_init", ctypes.c_int, []),
        ("tutti_shutdown", ctypes.c_int, []),
        ("tutti_is_initialized", ctypes.c_int, []),
        ("tutti_rank", ctypes.c_int, []), ("tutti_size", ctypes.c_int, []),
        ("tutti_local_rank", ctypes.c_int, []), ("tutti_local_size", ctypes.c_int, []),
        ("tutti_cross_rank", ctypes.c_int, []), ("tutti_cross_size", ctypes.c_int, []),
        ("tutti_last_error", ctypes.c_char_p, []),
        ("tutti_status_string", ctypes.c_char_p, [ctypes.c_int]),
        ("tutti_op_options_init", None, [ctypes.POINTER(OpOptions)]),
        ("tutti_allreduce_tensor_async", ctypes.c_int,
         [ctypes.c_char_p, ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
          ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_grouped_allreduce_async", ctypes.c_int,
         [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(Tensor), ctypes.POINTER(Tensor),
          ctypes.c_int, ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_broadcast_tensor_async", ctypes.c_int,
         [ctypes.c_char_p, ctypes.POINTER(Tensor), ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_allgather_async", ctypes.c_int,
         [ctypes.c_char_p, ctypes.POINTER(Tensor), ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_alltoall_async", ctypes.c_int,
         [ctypes.c_char_p, ctypes.POINTER(Tensor), ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_reducescatter_async", ctypes.c_int,
         [ctypes.c_char_p, ctypes.POINTER(Tensor), ctypes.POINTER(OpOptions), _I64P]),
        ("tutti_barrier", ctypes.c_int, [ctypes.c_int, ctypes.c_double]),
        ("tutti_join", ctypes.c_int, [ctypes.c_int, ctypes.c_double,
                                      ctypes.POINTER(ctypes.c_int)]),
        ("tutti_wait", ctypes.c_int, [ctypes.c_int64, ctypes.c_double]),
        ("tutti_wait_result", ctypes.c_int, [ctypes.c_int64, ctypes.c_double,
                                             ctypes.POINTER(Result)]),
        ("tutti_free", None, [ctypes.c_void_p]),
        ("tutti_add_process_set", ctypes.c_int, [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                                 ctypes.POINTER(ctypes.c_int)]),
        ("tutti_remove_process_set", ctypes.c_int, [ctypes.c_int]),
        ("tutti_process_set_rank", ctypes.c_int, [ctypes.c_int]),
        ("tutti_process_set_size", ctypes.c_int, [ctypes.c_int]),
        ("tutti_process_set_ranks", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                                   ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
]:
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


class TuttiError(RuntimeError):
    """A collective failed: the message is Tutti's (it names the op, the tensor and, for a
    mismatch across ranks, what each rank submitted). `status` is the C API's status name."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def status_name(st):
    return lib.tutti_status_string(st).decode()


def check(st, what):
    if st != OK:
        detail = lib.tutti_last_error().decode(errors="replace")
        raise TuttiError("tutti.jax: %s failed (%s): %s" % (what, status_name(st), detail),
                         status_name(st))


def tensor(array):
    """A Tensor over a C-contiguous numpy array (a 0-d array is shape (1,))."""
    t = Tensor()
    t.data = array.ctypes.data if array.size else None
    t.dtype = DTYPES[array.dtype.name]
    shape = array.shape or (1,)
    if len(shape) > MAX_DIMS:
        raise ValueError("tutti.jax: %d dimensions; Tutti takes at most %d"
                         % (len(shape), MAX_DIMS))
    t.ndim = len(shape)
    for i, d in enumerate(shape):
        t.shape[i] = d
    return t


def options(op=0, prescale=1.0, postscale=1.0, root=0, process_set=0):
    o = OpOptions()
    lib.tutti_op_options_init(ctypes.byref(o))
    o.op, o.prescale, o.postscale = int(op), float(prescale), float(postscale)
    o.root, o.process_set = int(root), int(process_set)
    return o


def wait(handle, what):
    check(lib.tutti_wait(handle, -1.0), what)


def wait_result(handle, what, dtype):
    """The output of an allgather/alltoall/reducescatter as a numpy array (and recv splits)."""
    r = Result()
    r.struct_size = ctypes.sizeof(Result)
    check(lib.tutti_wait_result(handle, -1.0, ctypes.byref(r)), what)
    try:
        shape = tuple(r.shape[i] for i in range(r.ndim))
        out = np.empty(shape, dtype=dtype)
        if r.nbytes:
            ctypes.memmove(out.ctypes.data, r.data, r.nbytes)
        splits = [r.recv_splits[i] for i in range(r.nsplits)] if r.recv_splits else None
    finally:
        if r.data:
            lib.tutti_free(r.data)
        if r.recv_splits:
            lib.tutti_free(r.recv_splits)
    return out, splits


# ---- the XLA FFI handlers ----
TARGETS = {
    "allreduce": "TuttiJaxAllreduce",
    "grouped_allreduce": "TuttiJaxGroupedAllreduce",
    "broadcast": "TuttiJaxBroadcast",
    "allgather": "TuttiJaxAllgather",
    "alltoall": "TuttiJaxAlltoall",
    "reducescatter": "TuttiJaxReducescatter",
    "barrier": "TuttiJaxBarrier",
    "join": "TuttiJaxJoin",
}
_registered = False


def register_ffi_targets():
    global _registered
    if _registered:
        return
    import jax
    for op, symbol in TARGETS.items():
        jax.ffi.register_ffi_target("tutti_" + op, jax.ffi.pycapsule(getattr(lib, symbol)),
                                    platform="cpu")
    _registered = True
