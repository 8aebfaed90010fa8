"""tutti.torch.elastic: training that survives lost workers and grows with new hosts, in
horovod.torch.elastic's shape (docs/elastic.md). Run it under tuttirun's elastic flags:

    import tutti.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() every few batches

    train(state)
"""

from tutti import _elastic_common
from tutti.torch.basics import HorovodInternalError
from tutti.torch.elastic.sampler import ElasticSampler
from tutti.torch.elastic.state import (FRAMEWORK, HostsUpdatedInterrupt, ObjectState, State,
                                       TorchState)


def run(func):
    """Decorator of the training function `func(state, ...)`: syncs the state from rank 0,
    runs `func`, and when it fails with a recoverable error (a worker died: HorovodInternalError)
    restores the last commit, re-initializes on the launcher's next world, syncs and runs it
    again; on HostsUpdatedInterrupt it re-initializes and syncs without a restore."""
    return _elastic_common.run(func, FRAMEWORK)


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState",
           "State", "TorchState", "run"]
