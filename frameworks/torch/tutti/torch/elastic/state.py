"""State, ObjectState and TorchState: what an elastic job commits, restores and syncs."""

import copy

import torch

from tutti import _elastic_common
from tutti._elastic_common import HostsUpdatedInterrupt  # noqa: F401
from tutti.torch import basics, functions, mpi_ops


def _any_rank(flag):
    out = mpi_ops.synchronize(mpi_ops.allreduce_async(
        torch.tensor([flag], dtype=torch.int32), name="tutti.elastic.hosts_updated",
        op=mpi_ops.Max))
    return int(out[0])


def _bcast_object(obj):
    return functions.broadcast_object(obj, root_rank=0, name="tutti.elastic.state")


FRAMEWORK = _elastic_common.Framework(
    "tutti.torch", shutdown=lambda: basics.shutdown(), init=lambda: basics.init(),
    errors=[basics.HorovodInternalError], recoverable=_elastic_common.recoverable_attribute,
    generation=lambda: basics._C.elastic_generation(),
    hosts_updated=lambda: basics._C.hosts_updated(), any_rank=_any_rank,
    bcast_object=_bcast_object)


class State(_elastic_common.State):
    """In-memory state of an elastic job (tutti._elastic_common.State), over tutti.torch."""

    _framework = FRAMEWORK


class ObjectState(_elastic_common.ObjectState, State):
    """State of plain Python objects given as keyword arguments (epoch=0, batch=0; see
    tutti._elastic_common.ObjectState), over tutti.torch."""


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
        forget = getattr(self.value, "_forget_pending", None)
        if forget is not None:
            forget()
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
