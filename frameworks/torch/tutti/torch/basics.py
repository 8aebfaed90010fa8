"""Lifecycle, topology, build flags and process sets (horovod.common.basics/process_sets)."""

import atexit
import threading
from typing import Any, Sequence, Union

import torch

from tutti._process_sets import check_new_set
from tutti.torch import _C

TuttiError = _C.TuttiError
TuttiValueError = _C.TuttiValueError
DuplicateNameError = _C.DuplicateNameError
TuttiTimeoutError = _C.TuttiTimeoutError
# Scripts written for Horovod catch this name around collectives.
HorovodInternalError = TuttiError

_NOT_INITIALIZED = "Tutti has not been initialized: call hvd.init() first"


def _require_init(what):
    if not _C.is_initialized():
        raise ValueError("%s: %s" % (what, _NOT_INITIALIZED))


_atexit_registered = False


class ProcessSet:
    """A subset of the ranks that collectives can run on (`process_set=` of every op).

    Create one with a sorted list of global ranks and register it on every rank with
    add_process_set() (or hvd.init(process_sets=[...])); until then it has no id.
    """

    process_set_id = None
    ranks = None

    def __init__(self, ranks):
        if not all(isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet takes a list of integer ranks (MPI communicators "
                             "are not supported by Tutti), got %r" % (ranks,))
        self.ranks = sorted(set(ranks))

    def _invalidate(self):
        self.process_set_id = None

    def _require_id(self):
        if self.process_set_id is None:
            raise ValueError("process set %s is not registered: call hvd.add_process_set() "
                             "on every rank first" % self)
        return self.process_set_id

    def size(self):
        """Number of ranks in the set, or None if it is not registered."""
        if self.process_set_id is None:
            return None
        return _C.process_set_size(self.process_set_id)

    def rank(self):
        """This process's rank within the set (-1 if not a member), None if unregistered."""
        if self.process_set_id is None:
            return None
        return _C.process_set_rank(self.process_set_id)

    def included(self):
        """Whether this process belongs to the set, None if it is not registered."""
        if self.process_set_id is None:
            return None
        return _C.process_set_rank(self.process_set_id) >= 0

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_registered = {}  # id -> ProcessSet, excluding the global one
# (op, process set id) -> how many unnamed ops of that kind the Python layer has named;
# starts again from 0 at shutdown, as the runtime's own counters do.
_noname_counters = {}
# (process set id, name) -> op, for each named op started here and not synchronized yet
# (tutti.torch.mpi_ops): a name stays taken until its handle is synchronized. Forgotten at
# shutdown, with the handles of that runtime.
_names_in_use = {}


def _process_set_id(process_set):
    _require_init("tutti.torch")
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a tutti.torch.ProcessSet, got %r" % (process_set,))
    return process_set._require_id()


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a process set; collective over ALL ranks, each passing the same ranks.

    Accepts a ProcessSet or a sequence of ranks; returns the registered ProcessSet.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%s is already registered" % process_set)
    _require_init("tutti.torch.add_process_set")
    with _lock:
        registered = {i: ps.ranks for i, ps in _registered.items()}
    check_new_set("tutti.torch.add_process_set", process_set.ranks, registered, _C.size())
    set_id = _C.add_process_set(process_set.ranks)
    process_set.process_set_id = set_id
    with _lock:
        _registered[set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters a process set (collective over all ranks). Returns True if removed."""
    if not isinstance(process_set, ProcessSet) or not process_set.process_set_id:
        return False
    set_id = process_set.process_set_id
    _C.remove_process_set(set_id)
    process_set._invalidate()
    with _lock:
        _registered.pop(set_id, None)
    return True


def _comm_ranks(comm):
    """The global ranks `comm` (a list of ranks or an mpi4py communicator) names, or None
    for the whole job."""
    if comm is None:
        return None
    if isinstance(comm, (list, tuple)):
        return sorted(int(r) for r in comm)
    if hasattr(comm, "Get_group") and hasattr(comm, "Get_size"):
        from mpi4py import MPI  # only reached with an mpi4py communicator in hand
        world = MPI.COMM_WORLD.Get_group()
        ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                          world)
        return sorted(ranks)
    raise ValueError("tutti.torch.init(comm=%r): expected a list of ranks or an mpi4py "
                     "communicator" % (comm,))


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Starts Tutti on this process; settings and topology come from the environment.

    comm: None, or a list of ranks / an mpi4py communicator spanning the whole job (Tutti
    runs on all the processes of the job; use process sets for subsets).
    process_sets: ProcessSets to register right away (or "dynamic", accepted and ignored:
    sets can always be added later).
    """
    ranks = _comm_ranks(comm)
    _C.init()
    # Like Horovod: a script that ends without hvd.shutdown() (or raises) still shuts Tutti
    # down, while the interpreter and the tensors of ops in flight are alive; the peers
    # then fail with "rank N called shutdown" instead of hanging.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    if ranks is not None and ranks != list(range(_C.size())):
        raise NotImplementedError(
            "tutti.torch.init(comm=...): the communicator holds ranks %s but the job has "
            "ranks 0..%d; Tutti runs on the whole job: call hvd.init() and use "
            "hvd.add_process_set(%s) for the subset (docs/pytorch.md)"
            % (ranks, _C.size() - 1, ranks))
    global_process_set.ranks = list(range(_C.size()))
    if process_sets is not None and not isinstance(process_sets, str):
        for process_set in process_sets:
            if process_set.process_set_id is None:
                add_process_set(process_set)


def shutdown() -> None:
    """Stops Tutti; registered process sets are forgotten (init() may be called again)."""
    _C.shutdown()
    with _lock:
        for process_set in _registered.values():
            process_set._invalidate()
        _registered.clear()
        _noname_counters.clear()
        _names_in_use.clear()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing the timeline, as horovod.torch does: `file_path` a file (rank 0 writes
    it) or a directory ending in "/" (every rank writes DIR/rank-N.json; merge them with
    `tutti-timeline merge DIR -o job.json`). `mark_cycles` marks every round. Starting again
    with the same path keeps the file; another path stops the first (docs/pytorch.md)."""
    _require_init("start_timeline()")
    _C.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Completes and closes the timeline file started by start_timeline (or TUTTI_TIMELINE)."""
    _require_init("stop_timeline()")
    _C.stop_timeline()


def stats() -> dict:
    """This rank's counters since init, {name: int}: ops and bytes by op and backend
    ("op.allreduce.gloo.bytes"), fused batches, cache hits and misses, rounds, and time per
    phase in nanoseconds ("time.backend_ns"). docs/pytorch.md lists them."""
    _require_init("stats()")
    return dict(_C.stats())


def is_initialized() -> bool:
    return bool(_C.is_initialized())


def _topology(value):
    if value < 0 or not _C.is_initialized():
        raise ValueError(_NOT_INITIALIZED)
    return value


def rank() -> int:
    """This process's global rank."""
    return _topology(_C.rank())


def size() -> int:
    """Number of processes in the job."""
    return _topology(_C.size())


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _topology(_C.local_rank())


def local_size() -> int:
    """Number of processes on this host."""
    return _topology(_C.local_size())


def cross_rank() -> int:
    """Index of this host among the hosts (rank among processes with this local rank)."""
    return _topology(_C.cross_rank())


def cross_size() -> int:
    """Number of hosts (processes with this local rank)."""
    return _topology(_C.cross_size())


def is_homogeneous() -> bool:
    """True when every host runs the same number of processes."""
    return size() == local_size() * cross_size()


def mpi_built() -> bool:
    return bool(_C.backend_built("mpi"))


def gloo_built() -> bool:
    return bool(_C.backend_built("gloo"))


def nccl_built() -> int:
    """The NCCL version as an int (e.g. 21805 for 2.18.5) when the NCCL backend is compiled
    in, else 0 (as Horovod). The version is the one torch reports (Tutti's NCCL backend
    requires the same major version)."""
    if not _C.backend_built("nccl"):
        return 0
    version = torch.cuda.nccl.version() if torch.cuda.is_available() else (2, 0, 0)
    if isinstance(version, int):
        return version
    major, minor, patch = (tuple(version) + (0, 0, 0))[:3]
    return major * 10000 + minor * 100 + patch


def cuda_built() -> bool:
    """GPU support (the NCCL backend) was compiled in."""
    return bool(_C.backend_built("nccl"))


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def mpi_enabled() -> bool:
    """The MPI backend carries this job's CPU collectives."""
    return bool(_C.is_initialized()) and _C.cpu_backend() == "mpi"


def gloo_enabled() -> bool:
    """The gloo backend carries this job's CPU collectives."""
    return bool(_C.is_initialized()) and _C.cpu_backend() == "gloo"


def nccl_enabled() -> bool:
    """GPU tensors go through NCCL: it is compiled in and torch sees a GPU."""
    return nccl_built() and torch.cuda.is_available()


def mpi_threads_supported() -> bool:
    """Whether MPI may be used by other threads; Tutti calls MPI from one thread only."""
    return mpi_enabled()


def cpu_backend() -> str:
    """Name of the backend in use for CPU tensors ("mpi" or "gloo"), "" before init."""
    return _C.cpu_backend()
