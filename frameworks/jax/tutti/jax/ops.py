"""Tutti's collectives for JAX arrays, eagerly and inside jax.jit.

Each op has two paths. Called with concrete arrays (outside any transformation) it runs on the
host through Tutti's C API and returns a new jax array. Called with tracers (inside jax.jit,
jax.grad, jax.vmap, ...) it becomes an XLA FFI custom call (libtutti_jax.so) with
has_side_effect=True, whose handler submits the op to Tutti and returns a future without
blocking XLA's thread. Every traced op is wrapped in a jax.custom_vjp with Horovod's gradient
(the same as tutti.torch's):
- allreduce, grouped_allreduce: allreduce of the gradient with the same op and scale factors;
- allgather: Average-allreduce of the gradient, sliced to this rank's rows;
- broadcast: Average-allreduce of the gradient on the root, zeros elsewhere;
- alltoall: alltoall of the gradient back with the received splits;
- reducescatter: allgather of the gradient, times the set size for Sum, times the scales.

Names. Tutti matches the ranks' ops by tensor name. An op given `name=` uses it; an unnamed
traced op is named "jax.<op>.<n>" with n counted when it is traced (every rank traces the same
program in the same order, so every rank derives the same names); its backward collectives are
"<name>.grad". Output shapes that depend on other ranks (allgather's first dimension,
alltoall's received rows) are exchanged once, when the op is traced.
"""
import pickle
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tutti._process_sets import check_new_set
from tutti.jax import _lib
from tutti.jax._lib import TuttiError

# Reduction ops (the C API's tutti_reduce_op_t).
Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product"}

_SUPPORTED = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16",
              "float32", "float64", "bool")
_counters = {}
# The last traced op's ordering token (see _ffi). A strong reference: JAX keeps no other to a
# token nobody uses, and a weak one would break the chain. It outlives its trace until the
# next op is traced, which jax.checking_leaks() reports (docs/jax.md, "Limits").
_token = [None]


# ---- lifecycle and topology ----
def init():
    """Starts Tutti on this process (settings from the environment, docs/env_vars.md)."""
    _lib.check(_lib.lib.tutti_init(), "init")
    _counters.clear()


def shutdown():
    """Stops Tutti; registered ProcessSets lose their ids (init() may be called again)."""
    _lib.check(_lib.lib.tutti_shutdown(), "shutdown")
    for obj in _registered.values():
        obj.process_set_id = None
    _registered.clear()
    _set_ranks.clear()


def is_initialized():
    return bool(_lib.lib.tutti_is_initialized())


def _require_init(what):
    if not _lib.lib.tutti_is_initialized():
        raise ValueError("tutti.jax: %s called before tutti.jax.init(); call "
                         "tutti.jax.init() first" % what)


def _topology(fn, what):
    _require_init(what)
    return fn()


def rank():
    return _topology(_lib.lib.tutti_rank, "rank()")


def size():
    return _topology(_lib.lib.tutti_size, "size()")


def local_rank():
    return _topology(_lib.lib.tutti_local_rank, "local_rank()")


def local_size():
    return _topology(_lib.lib.tutti_local_size, "local_size()")


def cross_rank():
    return _topology(_lib.lib.tutti_cross_rank, "cross_rank()")


def cross_size():
    return _topology(_lib.lib.tutti_cross_size, "cross_size()")


# ---- process sets ----
class ProcessSet:
    """A subset of the ranks that collectives can run on (`process_set=` of every op), as in
    Horovod and tutti.torch. Create one with a list of global ranks and register it on every
    rank with add_process_set(); until then (and after remove_process_set() or shutdown()) it
    has no id. Inside jit it is a static value: close over it or pass it as a static argument.
    """

    process_set_id = None
    ranks = None

    def __init__(self, ranks):
        ranks = list(ranks)
        if not all(isinstance(r, (int, np.integer)) for r in ranks):
            raise ValueError("tutti.jax.ProcessSet takes a list of integer ranks, got %r"
                             % (ranks,))
        self.ranks = sorted(set(int(r) for r in ranks))

    def _require_id(self):
        if self.process_set_id is None:
            raise ValueError("tutti.jax: process set %s is not registered: call "
                             "tutti.jax.add_process_set() on every rank first" % self)
        return self.process_set_id

    def size(self):
        """Number of ranks in the set, or None if it is not registered."""
        return None if self.process_set_id is None else _set_size(self.process_set_id)

    def rank(self):
        """This process's rank within the set (-1 if not a member), None if unregistered."""
        return None if self.process_set_id is None else _set_rank(self.process_set_id)

    def included(self):
        """Whether this process belongs to the set, None if it is not registered."""
        return None if self.process_set_id is None else _set_rank(self.process_set_id) >= 0

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_registered = {}  # id -> ProcessSet registered through a ProcessSet object
_set_ranks = {}  # id -> the set's global ranks, however it was registered


def add_process_set(ranks):
    """Registers a process set (collective over all ranks, each passing the same ranks).

    Given a ProcessSet, registers it and returns it (Horovod's form); given a sequence of
    ranks, returns the new set's integer id. Both forms are accepted by `process_set=`."""
    _require_init("add_process_set")
    obj = ranks if isinstance(ranks, ProcessSet) else None
    if obj is not None and obj.process_set_id is not None:
        raise ValueError("tutti.jax.add_process_set: %s is already registered" % obj)
    rs = obj.ranks if obj is not None else sorted(int(r) for r in ranks)
    check_new_set("tutti.jax.add_process_set", rs, _set_ranks, size())
    arr = (ctypes_int * len(rs))(*rs)
    out = _lib.ctypes.c_int(0)
    _lib.check(_lib.lib.tutti_add_process_set(arr, len(rs), _lib.ctypes.byref(out)),
               "add_process_set(%s)" % rs)
    _set_ranks[out.value] = list(rs)
    if obj is None:
        return out.value
    obj.process_set_id = out.value
    _registered[out.value] = obj
    return obj


def remove_process_set(process_set):
    """Unregisters a process set (collective over all ranks), given as a ProcessSet or id."""
    ps = _set_id(process_set)
    _lib.check(_lib.lib.tutti_remove_process_set(ps), "remove_process_set(%d)" % ps)
    obj = _registered.pop(ps, None)
    _set_ranks.pop(ps, None)
    if obj is not None:
        obj.process_set_id = None
    if isinstance(process_set, ProcessSet):
        process_set.process_set_id = None


ctypes_int = _lib.ctypes.c_int


def _set_id(process_set):
    if isinstance(process_set, ProcessSet):
        return int(process_set._require_id())
    if isinstance(process_set, (int, np.integer)) and not isinstance(process_set, bool):
        return int(process_set)
    raise ValueError("tutti.jax: process_set= takes a tutti.jax.ProcessSet or an integer id "
                     "from add_process_set, got %r" % (process_set,))


def _set_rank(ps):
    return rank() if ps == 0 else _lib.lib.tutti_process_set_rank(ps)


def _set_size(ps):
    return size() if ps == 0 else _lib.lib.tutti_process_set_size(ps)


def _root_in_set(root_rank, ps, what):
    """The position in process set `ps` of global rank `root_rank` (as Horovod, tutti.torch
    and tutti.tensorflow take it). A root outside the global set is left for the runtime to
    refuse on every rank."""
    root_rank = int(root_rank)
    if ps == 0:
        return root_rank
    ranks = _set_ranks.get(ps)
    if ranks is None:
        raise ValueError("tutti.jax.%s: process set %d is not registered on this rank"
                         % (what, ps))
    if root_rank not in ranks:
        raise ValueError("tutti.jax.%s: root_rank %d is not in the process set (ranks %s); "
                         "root_rank is a global rank" % (what, root_rank, ranks))
    return ranks.index(root_rank)


# ---- helpers ----
def _is_traced(*xs):
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_dtype(x, op, name):
    dt = np.dtype(x.dtype)
    if dt.name not in _SUPPORTED:
        raise TypeError("tutti.jax: %s of tensor '%s': dtype %s is not supported (Tutti "
                        "takes %s)" % (op, name or "<unnamed>", dt.name, ", ".join(_SUPPORTED)))


def _check_op(op, what):
    if op not in _OP_NAMES:
        raise ValueError("tutti.jax: %s: op %r is not one of Sum, Average, Min, Max, Product"
                         % (what, op))


def _traced_name(op, name, ps):
    if name:
        return str(name)
    n = _counters.get((op, ps), 0)
    _counters[(op, ps)] = n + 1
    return "jax.%s.%s%d" % (op, "set%d." % ps if ps else "", n)


def _grad_name(name):
    return name + ".grad"


def _host(x):
    a = np.asarray(x)  # (np.ascontiguousarray would make a 0-d array 1-d)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _current_trace():
    try:
        from jax._src import core as _core
        return _core.trace_ctx.trace
    except (ImportError, AttributeError):  # another jax: no chaining across ops
        return None


def _tracing():
    """Whether a trace other than eager evaluation is being built (jit, grad, vmap...)."""
    trace = _current_trace()
    if trace is None:
        return False
    from jax._src import core as _core
    eval_trace = getattr(_core, "EvalTrace", None)
    return eval_trace is None or not isinstance(trace, eval_trace)


def _ffi(target, out, vmap_method=None, in_place=False):
    """The custom call of `target`, returning a function of (*operands, **attrs) -> outputs.

    Every call also takes and returns an int32 ordering token: the output token of the
    previous Tutti op traced into the same function feeds the next one, a data dependency that
    makes XLA issue the ops in trace order (XLA's CPU runtime runs a jitted function's custom
    calls one at a time, each to completion, in an order of its choosing among independent
    ones; ranks whose programs differ slightly could otherwise pick different orders and wait
    for each other). has_side_effect keeps ops whose result is unused.

    in_place: each data operand (after the token) may share its buffer with the output of the
    same position (input_output_aliases), as torch's allreduce_ does: where the operand is an
    intermediate value (a gradient in a training step) XLA hands the op one buffer and
    allocates no output (fresh memory is slow to touch here); where XLA must keep the operand
    it copies it first. Only for ops whose outputs have their inputs' shapes."""
    _lib.register_ffi_targets()
    multiple = isinstance(out, (list, tuple))
    outs = [jax.ShapeDtypeStruct((), jnp.int32)] + (list(out) if multiple else [out])
    aliases = {i: i for i in range(1, len(outs))} if in_place else None
    call = jax.ffi.ffi_call("tutti_" + target, outs, has_side_effect=True,
                            vmap_method=vmap_method, input_output_aliases=aliases)

    def run(tok, *operands, **attrs):
        results = call(tok, *operands, **attrs)
        return results[0], (list(results[1:]) if multiple else results[1])

    return run


# ---- allreduce ----
def _allreduce_host(x, name, op, prescale, postscale, ps):
    a = _host(x)
    out = np.empty_like(a)
    h = _lib.ctypes.c_int64(0)
    o = _lib.options(op=op, prescale=prescale, postscale=postscale, process_set=ps)
    ti, to = _lib.tensor(a), _lib.tensor(out)
    _lib.check(_lib.lib.tutti_allreduce_tensor_async((name or "").encode(), ti, to, o,
                                                    _lib.ctypes.byref(h)),
               "allreduce of tensor '%s'" % (name or "<unnamed>"))
    _lib.wait(h.value, "allreduce of tensor '%s'" % (name or "<unnamed>"))
    return jnp.asarray(out)


def _in_trace(tok, trace):
    """`tok` or the value it wraps (a JVP/linearize tracer's primal, a batch tracer's value)
    as a tracer of `trace`, or None. This links a backward pass's first op to the forward
    pass's last: both are traced into the same jitted function, the forward under a JVP
    trace whose primal values are the outer trace's tracers."""
    for _ in range(16):
        if tok is None or not isinstance(tok, jax.core.Tracer):
            return None
        if getattr(tok, "_trace", None) is trace:
            return tok
        tok = next((getattr(tok, a) for a in ("primal", "val") if hasattr(tok, a)), None)
    return None


def _take_token():
    """The previous op's token when it belongs to the trace being built, else a fresh one."""
    trace = _current_trace()
    tok = _in_trace(_token[0], trace) if trace is not None else None
    return jnp.zeros((), jnp.int32) if tok is None else tok


def _put_token(tok):
    _token[0] = tok if _current_trace() is not None else None


def _ordered(f, *args):
    """Calls the custom_vjp function f(*args, tok) -> (out, tok) with the trace's token."""
    out, tok = f(*args, _take_token())
    _put_token(tok)
    return out


def _allreduce_ffi(tok, x, name, op, prescale, postscale, ps):
    return _ffi("allreduce", jax.ShapeDtypeStruct(x.shape, x.dtype), "broadcast_all",
                in_place=True)(
        tok, x, name=name, op=np.int64(op), prescale=np.float64(prescale),
        postscale=np.float64(postscale), process_set=np.int64(ps))


def _allreduce_traced(x, name, op, prescale, postscale, ps):
    @jax.custom_vjp
    def f(x, tok):
        tok, y = _allreduce_ffi(tok, x, name, op, prescale, postscale, ps)
        return y, tok

    def fwd(x, tok):
        return f(x, tok), None

    def bwd(_, cts):
        return (_allreduce_traced(cts[0], _grad_name(name), op, prescale, postscale, ps), None)

    f.defvjp(fwd, bwd)
    return _ordered(f, x)


def allreduce(tensor, average: Optional[bool] = None, name: Optional[str] = None,
              op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=0):
    """Reduces `tensor` over the ranks of the process set; every rank gets the result.

    op: Average (default), Sum, Min, Max or Product; `average` is horovod's older spelling.
    prescale_factor multiplies the input before the reduction, postscale_factor the result.
    Differentiable (custom VJP); inside jax.jit and under vmap (the batch is reduced
    elementwise, as without vmap)."""
    if op is None:
        op = Sum if average is False else Average
    _check_op(op, "allreduce")
    _require_init("allreduce")
    tensor = jnp.asarray(tensor) if not _is_traced(tensor) else tensor
    _check_dtype(tensor, "allreduce", name)
    ps = _set_id(process_set)
    if not _is_traced(tensor):
        return _allreduce_host(tensor, name, op, prescale_factor, postscale_factor, ps)
    return _allreduce_traced(tensor, _traced_name("allreduce", name, ps), op,
                             float(prescale_factor), float(postscale_factor), ps)


# ---- grouped allreduce ----
def _grouped_host(xs, names, op, prescale, postscale, ps):
    arrays = [_host(x) for x in xs]
    outs = [np.empty_like(a) for a in arrays]
    n = len(arrays)
    tin = (_lib.Tensor * n)(*[_lib.tensor(a) for a in arrays])
    tout = (_lib.Tensor * n)(*[_lib.tensor(a) for a in outs])
    cnames = (_lib.ctypes.c_char_p * n)(*[(s or "").encode() for s in names])
    h = _lib.ctypes.c_int64(0)
    o = _lib.options(op=op, prescale=prescale, postscale=postscale, process_set=ps)
    what = "grouped_allreduce of tensor '%s'" % (names[0] or "<unnamed>")
    _lib.check(_lib.lib.tutti_grouped_allreduce_async(cnames, tin, tout, n, o,
                                                      _lib.ctypes.byref(h)), what)
    _lib.wait(h.value, what)
    return [jnp.asarray(a) for a in outs]


def _grouped_ffi(tok, xs, names, op, prescale, postscale, ps):
    outs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
    return _ffi("grouped_allreduce", outs, "broadcast_all", in_place=True)(
        tok, *xs, names="\n".join(names), op=np.int64(op), prescale=np.float64(prescale),
        postscale=np.float64(postscale), process_set=np.int64(ps))


def _grouped_traced(xs, names, op, prescale, postscale, ps):
    @jax.custom_vjp
    def f(xs, tok):
        tok, ys = _grouped_ffi(tok, xs, names, op, prescale, postscale, ps)
        return ys, tok

    def fwd(xs, tok):
        return f(xs, tok), None

    def bwd(_, cts):
        return (_grouped_traced(list(cts[0]), [_grad_name(s) for s in names], op, prescale,
                                postscale, ps), None)

    f.defvjp(fwd, bwd)
    return _ordered(f, list(xs))


def grouped_allreduce(tensors, average: Optional[bool] = None, name: Optional[str] = None,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=0) -> List[Any]:
    """Allreduces a list of arrays as one group: negotiated and run together (fused).
    Returns a list. Differentiable; inside jax.jit."""
    if op is None:
        op = Sum if average is False else Average
    _check_op(op, "grouped_allreduce")
    _require_init("grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    for t in tensors:
        _check_dtype(t, "grouped_allreduce", name)
    ps = _set_id(process_set)
    if not _is_traced(*tensors):
        base = name or _traced_name("grouped_allreduce.eager", None, ps)
        names = ["%s.%d" % (base, i) for i in range(len(tensors))]
        return _grouped_host([jnp.asarray(t) for t in tensors], names, op, prescale_factor,
                             postscale_factor, ps)
    base = _traced_name("grouped_allreduce", name, ps)
    names = ["%s.%d" % (base, i) for i in range(len(tensors))]
    return _grouped_traced(tensors, names, op, float(prescale_factor),
                           float(postscale_factor), ps)


# ---- broadcast ----
def _broadcast_host(x, root, name, ps):
    buf = np.array(_host(x), copy=True)
    h = _lib.ctypes.c_int64(0)
    t = _lib.tensor(buf)
    what = "broadcast of tensor '%s'" % (name or "<unnamed>")
    _lib.check(_lib.lib.tutti_broadcast_tensor_async((name or "").encode(), t,
                                                    _lib.options(root=root, process_set=ps),
                                                    _lib.ctypes.byref(h)), what)
    _lib.wait(h.value, what)
    return buf  # numpy: the object collectives must not start JAX's backend


def _broadcast_traced(x, root, name, ps):
    @jax.custom_vjp
    def f(x, tok):
        tok, y = _ffi("broadcast", jax.ShapeDtypeStruct(x.shape, x.dtype), "broadcast_all",
                      in_place=True)(
            tok, x, name=name, root=np.int64(root), process_set=np.int64(ps))
        return y, tok

    def fwd(x, tok):
        return f(x, tok), None

    def bwd(_, cts):
        g = _allreduce_traced(cts[0], _grad_name(name), Average, 1.0, 1.0, ps)
        if _set_rank(ps) != root:
            g = jnp.zeros_like(g)
        return (g, None)

    f.defvjp(fwd, bwd)
    return _ordered(f, x)


def broadcast(tensor, root_rank: int, name: Optional[str] = None, process_set=0):
    """Returns the root's `tensor` on every rank of the set (root_rank: a global rank, a
    member of the set). Differentiable; inside jax.jit and under vmap."""
    _require_init("broadcast")
    _check_dtype(tensor, "broadcast", name)
    ps = _set_id(process_set)
    root = _root_in_set(root_rank, ps, "broadcast")
    if not _is_traced(tensor):
        return jnp.asarray(_broadcast_host(tensor, root, name, ps))
    return _broadcast_traced(tensor, root, _traced_name("broadcast", name, ps), ps)


# ---- allgather ----
def _allgather_host(x, name, ps):
    a = _host(x)
    if a.ndim == 0:
        raise ValueError("tutti.jax: allgather of tensor '%s': a 0-d array has no first "
                         "dimension to gather along; reshape it to (1,)" % (name or "<unnamed>"))
    h = _lib.ctypes.c_int64(0)
    what = "allgather of tensor '%s'" % (name or "<unnamed>")
    _lib.check(_lib.lib.tutti_allgather_async((name or "").encode(), _lib.tensor(a),
                                             _lib.options(process_set=ps),
                                             _lib.ctypes.byref(h)), what)
    out, _ = _lib.wait_result(h.value, what, a.dtype)
    return out


def _gathered_rows(rows, name, ps):
    """Every rank's first dimension, exchanged when an allgather is traced."""
    counts = _allgather_host(np.array([rows], dtype=np.int64), name + ".rows", ps)
    return [int(c) for c in counts]


def _allgather_traced(x, name, ps):
    rows = _gathered_rows(x.shape[0], name, ps)
    me = _set_rank(ps)
    start = sum(rows[:me])

    @jax.custom_vjp
    def f(x, tok):
        out = jax.ShapeDtypeStruct((sum(rows),) + tuple(x.shape[1:]), x.dtype)
        tok, y = _ffi("allgather", out, "sequential")(tok, x, name=name, process_set=np.int64(ps))
        return y, tok

    def fwd(x, tok):
        return f(x, tok), None

    def bwd(_, cts):
        g = _allreduce_traced(cts[0], _grad_name(name), Average, 1.0, 1.0, ps)
        return (jax.lax.slice_in_dim(g, start, start + rows[me], axis=0), None)

    f.defvjp(fwd, bwd)
    return _ordered(f, x)


def allgather(tensor, name: Optional[str] = None, process_set=0):
    """Concatenates every rank's `tensor` along the first dimension, in rank order; the
    first dimensions may differ across ranks (the other dimensions must agree).
    Differentiable; inside jax.jit (the first dimensions are exchanged when it is traced);
    under vmap, one allgather per batch element."""
    _require_init("allgather")
    _check_dtype(tensor, "allgather", name)
    ps = _set_id(process_set)
    if not _is_traced(tensor):
        return jnp.asarray(_allgather_host(tensor, name, ps))
    if tensor.ndim == 0:
        raise ValueError("tutti.jax: allgather of tensor '%s': a 0-d array has no first "
                         "dimension to gather along; reshape it to (1,)" % (name or "<unnamed>"))
    return _allgather_traced(tensor, _traced_name("allgather", name, ps), ps)


# ---- alltoall ----
def _equal_splits(rows, n, name):
    if rows % n:
        raise ValueError("tutti.jax: alltoall of tensor '%s': %d rows do not split equally "
                         "over %d ranks; pass splits=" % (name or "<unnamed>", rows, n))
    return [rows // n] * n


def _alltoall_host(x, splits, name, ps):
    a = _host(x)
    n = _set_size(ps)
    sp = _equal_splits(a.shape[0] if a.ndim else 1, n, name) if splits is None else \
        [int(s) for s in np.asarray(splits).reshape(-1)]
    arr = (_lib.ctypes.c_int64 * len(sp))(*sp)
    o = _lib.options(process_set=ps)
    o.splits = _lib.ctypes.cast(arr, _lib.ctypes.POINTER(_lib.ctypes.c_int64))
    o.nsplits = len(sp)
    h = _lib.ctypes.c_int64(0)
    what = "alltoall of tensor '%s'" % (name or "<unnamed>")
    _lib.check(_lib.lib.tutti_alltoall_async((name or "").encode(), _lib.tensor(a), o,
                                            _lib.ctypes.byref(h)), what)
    out, recv = _lib.wait_result(h.value, what, a.dtype)
    return out, recv


def _alltoall_traced(x, splits, name, ps):
    n = _set_size(ps)
    me = _set_rank(ps)
    # Every rank's splits, exchanged at trace time: this rank receives matrix[r][me] from r.
    mine = np.array(splits, dtype=np.int64)
    if mine.shape != (n,):
        raise ValueError("tutti.jax: alltoall of tensor '%s': %d splits for %d ranks"
                         % (name, mine.size, n))
    matrix = _allgather_host(mine, name + ".splits", ps).reshape(n, n)
    recv = [int(matrix[r][me]) for r in range(n)]

    @jax.custom_vjp
    def f(x, tok):
        out = jax.ShapeDtypeStruct((sum(recv),) + tuple(x.shape[1:]), x.dtype)
        tok, y = _ffi("alltoall", out, "sequential")(tok, x, name=name, splits=mine,
                                                     process_set=np.int64(ps))
        return y, tok

    def fwd(x, tok):
        return f(x, tok), None

    def bwd(_, cts):
        return (_alltoall_traced(cts[0], recv, _grad_name(name), ps)[0], None)

    f.defvjp(fwd, bwd)
    return _ordered(f, x), recv


def alltoall(tensor, splits=None, name: Optional[str] = None, process_set=0):
    """Sends splits[i] rows of `tensor` to rank i of the set (equal splits if None).

    Returns the received rows concatenated in rank order and, when `splits` is given, also
    the rows received from each rank (an int32 array). Differentiable; inside jax.jit
    `splits` must be static (a list or numpy array), exchanged when the op is traced."""
    _require_init("alltoall")
    _check_dtype(tensor, "alltoall", name)
    ps = _set_id(process_set)
    if not _is_traced(tensor):
        out, recv = _alltoall_host(tensor, splits, name, ps)
        out = jnp.asarray(out)
    else:
        if _is_traced(splits):
            raise TypeError("tutti.jax: alltoall of tensor '%s' inside jax.jit: splits must "
                            "be static (a list or numpy array), not a traced array"
                            % (name or "<unnamed>"))
        sp = _equal_splits(tensor.shape[0], _set_size(ps), name) if splits is None else \
            [int(s) for s in np.asarray(splits).reshape(-1)]
        out, recv = _alltoall_traced(tensor, sp, _traced_name("alltoall", name, ps), ps)
    if splits is None:
        return out
    return out, jnp.asarray(np.array(recv, dtype=np.int32))


# ---- reducescatter ----
def _scatter_rows(rows, n, me):
    return rows // n + (1 if me < rows % n else 0)


def _reducescatter_host(x, name, op, prescale, postscale, ps):
    a = _host(x)
    h = _lib.ctypes.c_int64(0)
    what = "reducescatter of tensor '%s'" % (name or "<unnamed>")
    o = _lib.options(op=op, prescale=prescale, postscale=postscale, process_set=ps)
    _lib.check(_lib.lib.tutti_reducescatter_async((name or "").encode(), _lib.tensor(a), o,
                                                 _lib.ctypes.byref(h)), what)
    out, _ = _lib.wait_result(h.value, what, a.dtype)
    return out


def _reducescatter_traced(x, name, op, prescale, postscale, ps):
    n, me = _set_size(ps), _set_rank(ps)
    rows = _scatter_rows(x.shape[0], n, me)
    scale = prescale * postscale * (n if op == Sum else 1)

    @jax.custom_vjp
    def f(x, tok):
        out = jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype)
        tok, y = _ffi("reducescatter", out, "sequential")(
            tok, x, name=name, op=np.int64(op), prescale=np.float64(prescale),
            postscale=np.float64(postscale), process_set=np.int64(ps))
        return y, tok

    def fwd(x, tok):
        return f(x, tok), None

    def bwd(_, cts):
        g = cts[0]
        if scale != 1.0:
            g = g * scale
        return (_allgather_traced(g, _grad_name(name), ps), None)

    f.defvjp(fwd, bwd)
    return _ordered(f, x)


def reducescatter(tensor, name: Optional[str] = None, op: int = Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set=0):
    """Reduces `tensor` over the ranks and gives each rank its block of rows (the first
    n % size ranks get one more row). op: Average (default), Sum, Min, Max, Product.
    Differentiable; inside jax.jit."""
    _check_op(op, "reducescatter")
    _require_init("reducescatter")
    _check_dtype(tensor, "reducescatter", name)
    ps = _set_id(process_set)
    if not _is_traced(tensor):
        return jnp.asarray(_reducescatter_host(tensor, name, op, prescale_factor,
                                               postscale_factor, ps))
    if tensor.ndim == 0:
        raise ValueError("tutti.jax: reducescatter of tensor '%s': a 0-d array has no rows"
                         % (name or "<unnamed>"))
    return _reducescatter_traced(tensor, _traced_name("reducescatter", name, ps), op,
                                 float(prescale_factor), float(postscale_factor), ps)


# ---- barrier, join ----
def _tokened(target, out, ps, timeout_seconds):
    """barrier/join inside a trace: the op in the ordering chain, its outputs but the token."""
    def f(tok):
        tok, y = _ffi(target, out)(tok, process_set=np.int64(ps),
                                   timeout_seconds=np.float64(timeout_seconds))
        return y, tok
    return _ordered(f)


def barrier(process_set=0, timeout_seconds: float = -1.0):
    """Blocks until every rank of the set has entered the barrier. Inside jit it runs where it
    was traced among the other Tutti ops of the function."""
    _require_init("barrier")
    ps = _set_id(process_set)
    if _tracing():
        _tokened("barrier", [], ps, float(timeout_seconds))
        return None
    _lib.check(_lib.lib.tutti_barrier(ps, float(timeout_seconds)), "barrier")


def join(process_set=0, timeout_seconds: float = -1.0):
    """This rank has no more data: until every rank has joined it contributes zeros to the
    others' allreduces. Blocks until all joined; returns the last rank that joined (an int
    eagerly, an int32 scalar array inside jit)."""
    _require_init("join")
    ps = _set_id(process_set)
    if _tracing():
        return _tokened("join", jax.ShapeDtypeStruct((), jnp.int32), ps, float(timeout_seconds))
    last = _lib.ctypes.c_int(-1)
    _lib.check(_lib.lib.tutti_join(ps, float(timeout_seconds),
                                   _lib.ctypes.byref(last)), "join")
    return last.value


# ---- Python objects ----
def broadcast_object(obj, root_rank: int = 0, name: Optional[str] = None, process_set=0):
    """The root's picklable `obj` on every rank of the set (root_rank: a global rank; host
    only)."""
    _require_init("broadcast_object")
    ps = _set_id(process_set)
    root = _root_in_set(root_rank, ps, "broadcast_object")
    name = name or "jax.broadcast_object"
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if _set_rank(ps) == root \
        else np.zeros(0, dtype=np.uint8)
    n = int(_broadcast_host(np.array([data.size], dtype=np.int64), root,
                            name + ".size", ps)[0])
    if _set_rank(ps) != root:
        data = np.zeros(n, dtype=np.uint8)
    data = np.asarray(_broadcast_host(data, root, name + ".data", ps))
    return pickle.loads(data.tobytes())


def allgather_object(obj, name: Optional[str] = None, process_set=0) -> list:
    """Every rank's picklable `obj`, as a list in rank order (host only)."""
    _require_init("allgather_object")
    ps = _set_id(process_set)
    name = name or "jax.allgather_object"
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = _allgather_host(np.array([data.size], dtype=np.int64), name + ".size", ps)
    allbytes = _allgather_host(data, name + ".data", ps)
    out, at = [], 0
    for s in sizes:
        out.append(pickle.loads(allbytes[at:at + int(s)].tobytes()))
        at += int(s)
    return out


__all__ = ["Sum", "Average", "Min", "Max", "Product", "TuttiError", "init", "shutdown",
           "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
           "cross_size", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set", "allreduce",
           "grouped_allreduce", "broadcast", "allgather", "alltoall", "reducescatter",
           "barrier", "join", "broadcast_object", "allgather_object"]
