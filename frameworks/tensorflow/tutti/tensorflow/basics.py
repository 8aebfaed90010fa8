"""Lifecycle, topology and build flags of tutti.tensorflow (horovod.tensorflow's basics),
over libtutti's C API."""

import atexit
import ctypes
import functools
import threading

import tensorflow as tf

from tutti._process_sets import check_new_set
from tutti.tensorflow._extension import load as _load

ops, _capi = _load()

_NOT_INITIALIZED = "Tutti has not been initialized: call hvd.init() first"


class TuttiError(RuntimeError):
    """A failed Tutti call outside a TensorFlow op (ops raise tf.errors.OpError), or an op's
    error an elastic job recovers from (see internal_error). `recoverable`: whether
    hvd.elastic.run resets on it."""

    recoverable = True  # one a script raises itself, as Horovod takes it


# Scripts written for Horovod catch this name around collectives.
HorovodInternalError = TuttiError


def _check(status, what):
    if status != 0:
        detail = _capi.tutti_last_error().decode(errors="replace")
        code = _capi.tutti_status_string(status).decode()
        error = TuttiError("%s: %s (%s)" % (what, detail or code, code))
        error.recoverable = bool(_capi.tutti_status_recoverable(status))
        raise error


# How the op library ends the message of an error an elastic job recovers from (a peer died,
# the job is being reset): TensorFlow raises every op error as the tf.errors class of its code.
RECOVERABLE_MARKER = _capi.tutti_tf_recoverable_marker().decode()
_internal_error_classes = {}


def is_recoverable(error):
    """Whether hvd.elastic.run resets on `error`: a HorovodInternalError that says so, or a
    tf.errors.OpError of a Tutti op (raised by a tf.function, a Keras fit) whose message
    carries RECOVERABLE_MARKER."""
    if isinstance(error, TuttiError):
        return bool(error.recoverable)
    message = getattr(error, "message", None)
    return isinstance(message, str) and RECOVERABLE_MARKER in message


def internal_error(error):
    """`error`, a tf.errors.OpError, as HorovodInternalError when it is recoverable: an
    instance of a class derived from both its own class (tf.errors.AbortedError, ...) and
    HorovodInternalError, so that handlers of either catch it. None when it is not."""
    if isinstance(error, TuttiError) or not is_recoverable(error):
        return None
    base = type(error)
    cls = _internal_error_classes.get(base)
    if cls is None:
        cls = type(base.__name__, (base, HorovodInternalError),
                   {"__module__": __name__, "recoverable": True,
                    "__doc__": "%s of a Tutti op that an elastic job recovers from "
                               "(also a HorovodInternalError)." % base.__name__})
        _internal_error_classes[base] = cls
    converted = cls(error.node_def, error.op, error.message)
    converted.recoverable = True
    return converted


def raises_internal_error(func):
    """Decorator: a recoverable tf.errors.OpError that `func` raises comes out as
    HorovodInternalError (internal_error); any other error as it was."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except tf.errors.OpError as e:
            converted = internal_error(e)
            if converted is None:
                raise
            raise converted.with_traceback(e.__traceback__) from None

    return wrapper


def _elastic_generation():
    """The launcher's generation this process joined; -1 before init and outside elastic
    jobs."""
    return int(_capi.tutti_elastic_generation())


def _hosts_updated():
    """Whether the launcher published a newer world than the one this process joined."""
    updated = ctypes.c_int(0)
    _check(_capi.tutti_hosts_updated(ctypes.byref(updated)), "hosts_updated")
    return bool(updated.value)


def _require_init(what):
    if not _capi.tutti_is_initialized():
        raise ValueError("%s: %s" % (what, _NOT_INITIALIZED))


class ProcessSet:
    """A subset of the ranks that collectives can run on (`process_set=` of every op).
    Register it on every rank with add_process_set() (or hvd.init(process_sets=[...]))."""

    process_set_id = None
    ranks = None

    def __init__(self, ranks):
        if not all(isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet takes a list of integer ranks (MPI communicators "
                             "are not supported by Tutti), got %r" % (ranks,))
        self.ranks = sorted(set(ranks))

    def size(self):
        if self.process_set_id is None:
            return None
        return _capi.tutti_process_set_size(self.process_set_id)

    def rank(self):
        if self.process_set_id is None:
            return None
        return _capi.tutti_process_set_rank(self.process_set_id)

    def included(self):
        if self.process_set_id is None:
            return None
        return _capi.tutti_process_set_rank(self.process_set_id) >= 0

    def __str__(self):
        # Horovod's form (mpi_comm is always None: Tutti takes no MPI communicators); the
        # global set lists every rank once Tutti runs.
        ranks = self.ranks
        if self.process_set_id == 0 and _capi.tutti_is_initialized():
            ranks = list(range(size()))
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=None)" % (
            self.process_set_id, ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_lock = threading.Lock()
_registered = {}
_atexit_registered = False


def _process_set_id(process_set):
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a tutti.tensorflow.ProcessSet, got %r"
                         % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("process set %s is not registered: call hvd.add_process_set() on "
                         "every rank first" % process_set)
    if process_set.process_set_id != 0 and process_set.process_set_id not in _registered:
        raise ValueError("process set id %d is not registered on this rank (%s)"
                         % (process_set.process_set_id, process_set))
    return process_set.process_set_id


def add_process_set(process_set):
    """Registers a process set; collective over ALL ranks, each passing the same ranks."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%s is already registered" % process_set)
    _require_init("add_process_set")
    with _lock:
        registered = {i: ps.ranks for i, ps in _registered.items()}
    check_new_set("tutti.tensorflow.add_process_set", process_set.ranks, registered, size())
    ranks = (ctypes.c_int * len(process_set.ranks))(*process_set.ranks)
    set_id = ctypes.c_int(0)
    _check(_capi.tutti_add_process_set(ranks, len(process_set.ranks), ctypes.byref(set_id)),
           "add_process_set(%s)" % process_set.ranks)
    process_set.process_set_id = set_id.value
    with _lock:
        _registered[set_id.value] = process_set
    return process_set


def _get_process_set_ids_and_ranks():
    """{id: ranks} of every process set registered on this rank, the global one (0) included
    (horovod.tensorflow's internal of the same name, which Horovod's tests read)."""
    _require_init("_get_process_set_ids_and_ranks")
    with _lock:
        out = {set_id: list(ps.ranks) for set_id, ps in _registered.items()}
    out[0] = list(range(size()))
    return out


def remove_process_set(process_set):
    """Unregisters a process set (collective over all ranks). Returns True if removed."""
    if not isinstance(process_set, ProcessSet) or not process_set.process_set_id:
        return False
    set_id = process_set.process_set_id
    _check(_capi.tutti_remove_process_set(set_id), "remove_process_set")
    process_set.process_set_id = None
    with _lock:
        _registered.pop(set_id, None)
    return True


def init(comm=None, process_sets=None):
    """Starts Tutti on this process; settings and topology come from the environment
    (tuttirun, mpirun or srun). comm: None or the list of all ranks. process_sets:
    ProcessSets to register right away ("dynamic" is accepted: sets can always be added)."""
    _check(_capi.tutti_init(), "tutti.tensorflow.init()")
    global _atexit_registered
    if not _atexit_registered:
        # As Horovod: a script that ends without hvd.shutdown() (or raises) still shuts down,
        # so that its peers fail with "rank N called shutdown" instead of hanging.
        atexit.register(shutdown)
        _atexit_registered = True
    if comm is not None and sorted(comm) != list(range(size())):
        raise NotImplementedError(
            "tutti.tensorflow.init(comm=%r): Tutti runs on the whole job; call hvd.init() and "
            "use hvd.add_process_set() for a subset" % (comm,))
    global_process_set.ranks = list(range(size()))
    if process_sets is not None and not isinstance(process_sets, str):
        for process_set in process_sets:
            if process_set.process_set_id is None:
                add_process_set(process_set)


def shutdown():
    """Stops Tutti; init() may be called again."""
    _check(_capi.tutti_shutdown(), "tutti.tensorflow.shutdown()")
    with _lock:
        for process_set in _registered.values():
            process_set.process_set_id = None
        _registered.clear()
        _noname_counters.clear()


def is_initialized():
    return bool(_capi.tutti_is_initialized())


def _topology(value):
    if value < 0 or not _capi.tutti_is_initialized():
        raise ValueError(_NOT_INITIALIZED)
    return value


def rank():
    """This process's global rank."""
    return _topology(_capi.tutti_rank())


def size():
    """Number of processes in the job."""
    return _topology(_capi.tutti_size())


def local_rank():
    return _topology(_capi.tutti_local_rank())


def local_size():
    return _topology(_capi.tutti_local_size())


def cross_rank():
    return _topology(_capi.tutti_cross_rank())


def cross_size():
    return _topology(_capi.tutti_cross_size())


def is_homogeneous():
    return size() == local_size() * cross_size()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the timeline (a file rank 0 writes, or a directory ending in "/")."""
    _require_init("start_timeline()")
    _check(_capi.tutti_start_timeline(str(file_path).encode(), int(bool(mark_cycles))),
           "start_timeline")


def stop_timeline():
    _require_init("stop_timeline()")
    _check(_capi.tutti_stop_timeline(), "stop_timeline")


def mpi_built():
    return bool(_capi.tutti_backend_built(b"mpi"))


def gloo_built():
    return bool(_capi.tutti_backend_built(b"gloo"))


def nccl_built():
    """0: the TensorFlow ops of this build run on CPU tensors only."""
    return 0


def cuda_built():
    return False


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def mpi_enabled():
    return is_initialized() and _capi.tutti_cpu_backend().decode() == "mpi"


def gloo_enabled():
    return is_initialized() and _capi.tutti_cpu_backend().decode() == "gloo"


def nccl_enabled():
    return False


def mpi_threads_supported():
    return mpi_enabled()


_noname_counters = {}


def _next_noname(kind):
    """How many unnamed grouped ops of `kind` this rank has issued (from 0 after init)."""
    count = _noname_counters.get(kind, 0)
    _noname_counters[kind] = count + 1
    return count
