"""DistributedOptimizer: averages gradients across ranks while backward is still running.

Each parameter's gradient allreduce starts from a hook that fires as soon as autograd has
accumulated that gradient, so communication overlaps the rest of backward; step() (or
synchronize()) waits only for what is still in flight, writes the reduced gradients back
and then runs the wrapped optimizer's step.

On the common path (no compression, no groups, op other than Adasum) the hooks are C++ ones
(_C.GradReducer, as DDP's reducer): a dense contiguous gradient's allreduce starts on
autograd's thread without entering Python. Gradients it leaves (sparse ones, those without
a gradient, those still accumulating at step()) are started here in synchronize().
"""

import warnings
from contextlib import contextmanager
from typing import Iterable, List, Optional, Tuple, Union

import torch

from tutti.torch import mpi_ops
from tutti.torch.basics import ProcessSet, _process_set_id, global_process_set, size
from tutti.torch.compression import Compression
from tutti.torch.mpi_ops import Adasum, Average, _C, synchronize

# The ctx of a gradient reduced on the lean path (_allreduce_grad_async): its handle is the
# runtime's own, waited for directly.
_LEAN = object()


def _split_list(items, n):
    q, r = divmod(len(items), n)
    return [items[i * q + min(i, r):(i + 1) * q + min(i + 1, r)] for i in range(n)]


def _name_parameters(param_groups, named_parameters):
    """{parameter: name} from named_parameters (checked: tuples, unique names, every
    parameter named), or "noname.<group>.<index>" names."""
    all_params = [p for group in param_groups for p in group["params"]]
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("noname.%d.%d" % (g, i), p)
                            for g, group in enumerate(param_groups)
                            for i, p in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, "
                         "parameter), usually produced by model.named_parameters().")
    names = [name for name, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found "
                         "duplicates: %s" % ", ".join(dups))
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = [id(p) for p in all_params if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model "
                         "parameters were not named. Python object ids: %s"
                         % ", ".join(str(i) for i in unnamed))
    return {p: name for name, p in named_parameters}


class _DistributedOptimizer(torch.optim.Optimizer):
    # Methods of this class are copied into a subclass of the wrapped optimizer's class, so
    # they call super(self.__class__, self) (the wrapped class), never bare super().
    _tutti_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        all_params = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in all_params}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles = {}  # param or tuple of params (a group) -> (handle, ctx)
        self._hooks = []
        self._reducer = None  # _C.GradReducer: the C++ hooks of the common path
        self._reducer_params = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._setup_groups(groups, all_params)
        if process_set.included():
            self._register_hooks()

    def _setup_groups(self, groups, all_params):
        self._groups = None
        self._p_to_group = {}
        self._group_counts = {}
        if groups is None or groups == 0:
            return
        trainable = [p for p in all_params if p.requires_grad]
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a non-negative integer or a list of lists "
                                 "of parameters, got %d" % groups)
            group_lists = [g for g in _split_list(trainable, groups) if g]
        elif isinstance(groups, list):
            group_lists = [list(g) for g in groups if len(g) > 0]
            grouped = {p for g in group_lists for p in g}
            group_lists += [[p] for p in trainable if p not in grouped]
        else:
            raise ValueError("groups must be an int or a list of lists of parameters")
        self._groups = [tuple(g) for g in group_lists]
        for group in self._groups:
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def _register_hooks(self):
        if (self._compression is Compression.none and self.op != Adasum
                and self._groups is None):
            params = [p for group in self.param_groups for p in group["params"]
                      if p.requires_grad]
            self._requires_update.update(params)
            prescale, postscale = self._scale_factors()
            self._reducer = _C.GradReducer(
                params, ["allreduce." + self._parameter_names[p] for p in params],
                int(self.op), float(prescale), float(postscale),
                _process_set_id(self._process_set), int(self.backward_passes_per_step))
            self._reducer_params = params
            return
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                if hasattr(p, "register_post_accumulate_grad_hook"):
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        self._make_hook(p)))
                else:
                    # The grad accumulator's post hook runs once p.grad holds the gradient.
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._hooks.append(grad_acc)  # keeps the accumulator (and hook) alive

    def _scale_factors(self):
        if self.op == Average:
            # The runtime divides by the set size after the prescale; splitting the
            # division as 1/f before and f after keeps large sums in range.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _grad_of(self, p):
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): send zeros.
            p.grad = torch.zeros_like(p)
        return p.grad

    def _allreduce_grad_async(self, p):
        grad = self._grad_of(p)
        prescale, postscale = self._scale_factors()
        if (not grad.is_sparse and self._compression is Compression.none
                and self.op != Adasum and grad.is_contiguous()):
            # The common case, every step for every parameter: p.grad itself, dense and
            # contiguous, reduced in place, uncompressed. Straight to the runtime, without
            # the general path's wrappers (about half of the per-tensor Python time); `grad`
            # stays referenced until synchronize() has waited for it.
            handle = _C.allreduce_async("allreduce." + self._parameter_names[p], grad, grad,
                                        int(self.op), float(prescale), float(postscale),
                                        _process_set_id(self._process_set))
            return handle, (_LEAN, grad)
        if grad.is_sparse:
            if not self._sparse_as_dense:
                wait = mpi_ops.sparse_allreduce_async(
                    grad, "allreduce." + self._parameter_names[p], self.op,
                    self._process_set)
                return wait, None
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        handle = mpi_ops.allreduce_async_(compressed, name="allreduce." + self._parameter_names[p],
                                          op=self.op, prescale_factor=prescale,
                                          postscale_factor=postscale,
                                          process_set=self._process_set)
        return handle, (compressed, ctx)

    def _grouped_allreduce_grad_async(self, group):
        pairs = [self._compression.compress(self._grad_of(p)) for p in group]
        prescale, postscale = self._scale_factors()
        compressed = [c for c, _ in pairs]
        names = [self._parameter_names[p] for p in group]
        handle = mpi_ops.grouped_allreduce_async_(
            compressed, name="allreduce.group." + "+".join(names), op=self.op,
            prescale_factor=prescale, postscale_factor=postscale,
            process_set=self._process_set)
        return handle, [(c, ctx) for c, ctx in pairs]

    def _make_hook(self, p):
        def hook(*ignore):
            if self._handles.get(p, (None, None))[0] is not None \
                    and self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate "
                    "gradients locally.")
            assert self._allreduce_delay[p] > 0
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._handles[p] = (None, None)
                return
            if self._groups is not None and p in self._p_to_group:
                group = self._p_to_group[p]
                self._group_counts[group] += 1
                if self._group_counts[group] == len(group):
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    for gp in group:
                        self._handles.pop(gp, None)
                    self._group_counts[group] = 0
                else:
                    self._handles[p] = (None, None)
                return
            self._handles[p] = self._allreduce_grad_async(p)
        return hook

    def synchronize(self):
        """Waits for every gradient allreduce (starting those not yet started, e.g. for
        parameters without a gradient this step) and writes the results into p.grad."""
        if not self._process_set.included():
            self._synchronized = True
            return
        started = self._in_flight()
        if self._groups is not None:
            for group in self._groups:
                if not any(p in started for p in group):
                    for p in group:
                        self._handles.pop(p, None)
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    self._group_counts[group] = 0
                    started.update(group)
        for p in sorted(self._requires_update - started, key=self._parameter_names.get):
            self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in self._handles.items():
            if ctx is None:  # a sparse gradient: `handle` waits and returns the result
                self._write_grad(key, handle(), None)
                continue
            if ctx[0] is _LEAN:  # reduced in place into p.grad
                _C.wait(handle, -1.0, None)
                self._allreduce_delay[key] = self.backward_passes_per_step
                continue
            synchronize(handle)
            if isinstance(key, tuple):
                for p, (compressed, c) in zip(key, ctx):
                    self._write_grad(p, compressed, c)
            else:
                self._write_grad(key, *ctx)
        self._handles.clear()
        if self._reducer is not None:
            self._reducer.wait(int(self.backward_passes_per_step))
        self._synchronized = True

    def _in_flight(self):
        """The parameters whose gradient allreduce has started and not been waited for."""
        params = set()
        for key, (handle, _) in self._handles.items():
            if handle is not None:
                params.update(key if isinstance(key, tuple) else (key,))
        if self._reducer is not None:
            params.update(self._reducer_params[i] for i in self._reducer.started())
        return params

    def _forget_pending(self):
        """Drops the allreduces in flight without waiting and counts backward passes afresh
        (an elastic reset: the runtime that ran them is gone)."""
        self._handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        if self._reducer is not None:
            self._reducer.reset(int(self.backward_passes_per_step))

    def set_backward_passes_per_step(self, passes):
        """Sets backward_passes_per_step and counts the passes afresh (as horovod.torch);
        between step() and the next backward pass, with no allreduce in flight."""
        if self._in_flight():
            raise AssertionError("set_backward_passes_per_step() was called while gradient "
                                 "allreduces were in flight; call it after step() or "
                                 "synchronize().")
        self.backward_passes_per_step = passes
        self._forget_pending()

    def _write_grad(self, p, compressed, ctx):
        self._allreduce_delay[p] = self.backward_passes_per_step
        reduced = compressed if ctx is None else self._compression.decompress(compressed, ctx)
        if p.grad.is_sparse:
            # Sparse gradients cannot be copied into; sparse_as_dense reduced a dense copy.
            with torch.no_grad():
                p.grad.zero_().add_(reduced if reduced.is_sparse else reduced.to_sparse())
        elif reduced.data_ptr() != p.grad.data_ptr():
            with torch.no_grad():
                p.grad.copy_(reduced)

    @contextmanager
    def skip_synchronize(self):
        """Inside this context step() does not synchronize: use it after calling
        synchronize() yourself (e.g. to clip gradients before the step)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced "
                              "again, which is wasted work. Call step() inside `with "
                              "optimizer.skip_synchronize():` after synchronize().")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles or (self._reducer is not None and self._reducer.pending()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() "
                                 "but before optimizer.step() or optimizer.synchronize(). "
                                 "This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """op=Adasum: each rank steps the wrapped optimizer on its own gradients, and the
    parameter changes (the deltas) are Adasum-reduced and applied from where every rank
    started, as horovod.torch's delta optimizer does. Methods are copied like
    _DistributedOptimizer's."""
    _tutti_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step

    def synchronize(self):
        """Nothing to wait for: the deltas are reduced in step()."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        params = sorted((p for group in self.param_groups for p in group["params"]
                         if p.requires_grad), key=self._parameter_names.get)
        with torch.no_grad():
            start = [p.detach().clone() for p in params]
            super(self.__class__, self).step()
            deltas = []
            for p, s in zip(params, start):
                compressed, ctx = self._compression.compress(p.detach() - s)
                deltas.append((compressed, ctx))
            for p, s, (compressed, ctx) in zip(params, start, deltas):
                synchronize(mpi_ops.allreduce_async_(
                    compressed, name="adasum." + self._parameter_names[p],
                    op=mpi_ops.Adasum))
                p.copy_(s + self._compression.decompress(compressed, ctx))
        return loss


def _wrapper_class(optimizer, methods):
    """A subclass of the optimizer's class with the methods of `methods`."""
    return type(optimizer.__class__.__name__, (optimizer.__class__,),
                {k: v for k, v in methods.__dict__.items()
                 if k not in ("__dict__", "__weakref__", "__doc__")})


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: type = Compression.none,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Union[int, List[List[torch.Tensor]], None] = None,
                         sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """Wraps a torch optimizer so that step() uses gradients reduced over all ranks.

    named_parameters: model.named_parameters(), to name each allreduce ("allreduce.<name>").
    compression: Compression.none or Compression.fp16. backward_passes_per_step: number of
    local backward passes accumulated before each allreduce. op: Average (default), Sum,
    ... gradient_predivide_factor: with Average, divide by this before the sum and by
    size/factor after. groups: an int (that many grouped allreduces) or a list of lists of
    parameters reduced together. sparse_as_dense: reduce sparse gradients (e.g. of
    nn.Embedding(sparse=True)) as dense tensors instead of allgathering their indices and
    values. process_set: ranks to reduce over. op=Adasum (power-of-two world sizes, global
    set): every rank steps on its own gradients and the parameter deltas are
    Adasum-reduced, as in horovod.torch.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == mpi_ops.Adasum and size() > 1:
        if _process_set_id(process_set) != 0:
            raise NotImplementedError("DistributedOptimizer: Adasum works on the global "
                                      "process set only (as in Horovod)")
        cls = _wrapper_class(optimizer, _DistributedAdasumOptimizer)
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)
    if op == mpi_ops.Adasum:  # one rank: Adasum of one gradient is that gradient
        op = mpi_ops.Sum
    mpi_ops._check_op(op, "DistributedOptimizer")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    cls = _wrapper_class(optimizer, _DistributedOptimizer)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
