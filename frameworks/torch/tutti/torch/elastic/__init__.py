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

import functools
import os
import time

from tutti.torch import basics
from tutti.torch.basics import HorovodInternalError
from tutti.torch.elastic.sampler import ElasticSampler
from tutti.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState

# Resets one run() may go through; the launcher's --reset-limit and --elastic-timeout stop
# the job long before in practice, this only bounds the loop.
MAX_RESETS = 100000
# Pause between failed inits of one reset (a world still forming, or none for this worker).
RETRY_SECONDS = 0.1


def _reset():
    basics.shutdown()
    basics.init()


def _recoverable(error):
    # Errors of the runtime say whether the job can go on; one a script raised itself
    # (raise HorovodInternalError(...)) is taken as recoverable, as Horovod does.
    return getattr(error, "recoverable", True)


def run(func):
    """Decorator of the training function `func(state, ...)`: syncs the state from rank 0,
    runs `func`, and when it fails with a recoverable error (a worker died: HorovodInternalError)
    restores the last commit, re-initializes on the launcher's next world, syncs and runs it
    again; on HostsUpdatedInterrupt it re-initializes and syncs without a restore."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        for _ in range(MAX_RESETS):
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if not _recoverable(e):
                    raise
                state.restore()
            except HostsUpdatedInterrupt:
                pass
            # init itself may fail while the world changes; for longer than the launcher
            # waits for a world it is over (a launcher found gone fails it at once: that
            # error is not recoverable).
            deadline = time.monotonic() + float(os.environ.get("TUTTI_ELASTIC_TIMEOUT", 600))
            for _ in range(MAX_RESETS):
                try:
                    _reset()
                    break
                except HorovodInternalError as e:
                    if not _recoverable(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(RETRY_SECONDS)
            state.on_reset()
        raise HorovodInternalError("tutti.torch.elastic.run: %d resets without finishing"
                                   % MAX_RESETS)

    return wrapper


__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState",
           "State", "TorchState", "run"]
