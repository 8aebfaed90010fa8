"""The framework-neutral part of Tutti's elastic training (docs/elastic.md): the run() loop,
State and ObjectState, shared by tutti.torch.elastic and tutti.tensorflow.elastic.

What differs between frameworks is gathered in a `Framework` (its reset, its error classes,
its launcher queries and two small collectives); each framework's elastic module makes one
and subclasses State and ObjectState with it, so that scripts see classes of their own
framework (hvd.elastic.State, hvd.elastic.ObjectState) as in Horovod.
"""

import functools
import os
import time

# Resets one run() may go through; the launcher's --reset-limit and --elastic-timeout stop
# the job long before in practice, this only bounds the loop.
MAX_RESETS = 100000
# Pause between failed inits of one reset (a world still forming, or none for this worker).
RETRY_SECONDS = 0.1


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit()/check_host_updates() on every rank at once when the launcher
    has hosts to add or remove: run() then re-initializes on the new world and syncs.
    `skip_sync` is False: Tutti always syncs after a reset."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated; re-initializing on the new world")
        self.skip_sync = skip_sync


class Framework:
    """The hooks of one framework.

    name: "tutti.torch", ... (in messages). shutdown(), init(): its lifecycle.
    errors: the exception classes a failed collective or init raises (the first is its
    HorovodInternalError, raised by run() itself). recoverable(error): whether an error of
    those classes lets the job go on. generation(): the launcher's generation this process
    joined (< 0 outside an elastic job). hosts_updated(): whether the launcher published a
    newer one. any_rank(flag): 1 when `flag` (0 or 1) is 1 on some rank (a collective).
    bcast_object(obj): rank 0's picklable obj on every rank."""

    def __init__(self, name, shutdown, init, errors, recoverable, generation, hosts_updated,
                 any_rank, bcast_object):
        self.name = name
        self.shutdown = shutdown
        self.init = init
        self.errors = tuple(errors)
        self.recoverable = recoverable
        self.generation = generation
        self.hosts_updated = hosts_updated
        self.any_rank = any_rank
        self.bcast_object = bcast_object


def recoverable_attribute(error):
    """Errors of the runtime say whether the job can go on (their `recoverable`); one a
    script raised itself (raise HorovodInternalError(...)) is taken as recoverable, as
    Horovod does."""
    return getattr(error, "recoverable", True)


def _reset(framework):
    # init itself may fail while the world changes; for longer than the launcher waits for a
    # world it is over (a launcher found gone fails it at once: that error is not
    # recoverable).
    deadline = time.monotonic() + float(os.environ.get("TUTTI_ELASTIC_TIMEOUT", 600))
    for _ in range(MAX_RESETS):
        try:
            framework.shutdown()
            framework.init()
            return
        except framework.errors as e:
            if not framework.recoverable(e) or time.monotonic() > deadline:
                raise
            time.sleep(RETRY_SECONDS)


def run(func, framework):
    """What `@hvd.elastic.run` makes of the training function `func(state, ...)`: syncs the
    state from rank 0, runs `func`, and when it fails with a recoverable error (a worker died)
    restores the last commit, re-initializes on the launcher's next world, syncs and runs it
    again; on HostsUpdatedInterrupt it re-initializes and syncs without a restore."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        for _ in range(MAX_RESETS):
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except framework.errors as e:
                if not framework.recoverable(e):
                    raise
                state.restore()
            except HostsUpdatedInterrupt:
                pass
            _reset(framework)
            state.on_reset()
        raise framework.errors[0]("%s.elastic.run: %d resets without finishing"
                                  % (framework.name, MAX_RESETS))

    return wrapper


class _HostUpdates:
    """`State._host_messages`: what Horovod's State keeps as a queue of the launcher's host
    notices, which scripts written for it (Horovod's own elastic tests among them) poll with
    empty(). Here empty() asks the launcher whether it published a newer world."""

    def __init__(self, framework):
        self._framework = framework

    def empty(self):
        if self._framework.generation() < 0:
            return True
        return not self._framework.hosts_updated()


class State:
    """In-memory state of an elastic job, kept the same on every worker.

    save() copies it to host memory, restore() returns to the last save, sync() sends rank 0's
    to every worker; commit() = save() + check_host_updates(). Subclasses define those three;
    reset() runs after a reset, before sync(). A framework's State sets `_framework`."""

    _framework = None

    def __init__(self):
        self._reset_callbacks = []
        self._host_messages = _HostUpdates(self._framework)
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
        framework = self._framework
        if framework.generation() < 0:
            return
        if framework.any_rank(1 if framework.hosts_updated() else 0):
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
        self._bcast = bcast_object or self._framework.bcast_object
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
