"""State, ObjectState and TorchState: what an elastic job commits, restores and syncs."""

import copy

import torch

from tutti.torch import basics, functions, mpi_ops


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit()/check_host_updates() on every rank at once when the launcher
    has hosts to add or remove: run() then re-initializes on the new world and syncs.
    `skip_sync` is False: Tutti always syncs after a reset."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated; re-initializing on the new world")
        self.skip_sync = skip_sync


def _bcast_object(obj):
    return functions.broadcast_object(obj, root_rank=0, name="tutti.elastic.state")


class _HostUpdates:
    """`State._host_messages`: what Horovod's State keeps as a queue of the launcher's host
    notices, which scripts written for it (Horovod's own elastic tests among them) poll with
    empty(). Here empty() asks the launcher whether it published a newer world."""

    def empty(self):
        if basics._C.elastic_generation() < 0:
            return True
        return not basics._C.hosts_updated()


class State:
    """In-memory state of an elastic job, kept the same on every worker.

    save() copies it to host memory, restore() returns to the last save, sync() sends rank 0's
    to every worker; commit() = save() + check_host_updates(). Subclasses define those three;
    reset() runs after a reset, before sync()."""

    def __init__(self):
        self._reset_callbacks = []
        self._host_messages = _HostUpdates()
        self._last_updated_timestamp = 0  # Horovod's; kept for scripts that reset it

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset, e.g. to rescale the learning
        rate to the new world size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then raises HostsUpdatedInterrupt if hosts changed. Each commit
        costs a copy and one small collective: commit every few batches, not every one."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt, on every rank together, when the launcher has
        published a new world (asks its rendezvous server; rank agreement by allreduce).
        Outside an elastic job (plain tuttirun, mpirun) no new world comes: it returns."""
        if basics._C.elastic_generation() < 0:
            return
        local = 1 if basics._C.hosts_updated() else 0
        flag = mpi_ops.synchronize(mpi_ops.allreduce_async(
            torch.tensor([local], dtype=torch.int32), name="tutti.elastic.hosts_updated",
            op=mpi_ops.Max))
        if int(flag[0]) != 0:
            raise HostsUpdatedInterrupt(False)

    def save(self):
        raise NotImplementedError("State.save(): subclasses say what to save")

    def restore(self):
        raise NotImplementedError("State.restore(): subclasses say what to restore")

    def sync(self):
        raise NotImplementedError("State.sync(): subclasses say what to sync")

    def reset(self):
        pass


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and kept as attributes
    (epoch=0, batch=0): saved by value, synced with broadcast_object from rank 0."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        # bcast_object/get_rank: Horovod's signature; Tutti's own are used when None.
        self._bcast = bcast_object or _bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__()

    def save(self):
        self._saved_state = {k: getattr(self, k) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for key, value in self._saved_state.items():
            setattr(self, key, value)


class _Handler:
    """Saves, restores and syncs one value of a TorchState that is not a plain object."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)


class _ModelHandler(_Handler):
    def sync(self):
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self):
        # A step that failed half-way leaves a DistributedOptimizer with handles of the old
        # world's allreduces and with its backward passes counted: both go with the step.
        pending = getattr(self.value, "_handles", None)
        if pending:
            pending.clear()
        delay = getattr(self.value, "_allreduce_delay", None)
        if delay is not None:
            for p in delay:
                delay[p] = self.value.backward_passes_per_step
        super().restore()

    def sync(self):
        functions.broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self):
        self.value.load_state_dict(_bcast_object(self.value.state_dict()))


def _handler_for(value):
    from tutti.torch.elastic.sampler import ElasticSampler
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """State of a model, an optimizer and any other values (an ElasticSampler, epoch=...).

    Modules, optimizers and ElasticSamplers are saved as deep copies of their state_dict()
    and synced by broadcast from rank 0; other values as in ObjectState."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers, plain = {}, {}
        for key, value in values.items():
            handler = _handler_for(value)
            if handler is None:
                plain[key] = value
            else:
                handlers[key] = handler
        self._handlers = handlers
        for key, handler in handlers.items():
            object.__setattr__(self, key, handler.value)
        super().__init__(**plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers:  # state.model = other_model
            handlers[name].value = value
        object.__setattr__(self, name, value)
