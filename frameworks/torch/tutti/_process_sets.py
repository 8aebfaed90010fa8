"""What every adapter's add_process_set checks before it registers a set (Horovod's rules).

A set's ranks must differ from those of every set registered through the adapter's API and
from the global set's (every rank): Horovod refuses a duplicate with ValueError, and so does
each Tutti adapter (tutti.torch, tutti.tensorflow, tutti.jax). Every rank registers the same
sets in the same order (add_process_set is collective), so every rank refuses alike and none
is left waiting. torch.distributed's groups add their process sets through the runtime
directly: two groups of the same ranks are two sets.
"""


def check_new_set(who, ranks, registered, world_size):
    """Raises ValueError when `ranks` (sorted) equal the global set's or those of a set in
    `registered` ({id: ranks}), naming `who`, the set it repeats and the ranks."""
    ranks = list(ranks)
    if ranks == list(range(world_size)):
        raise ValueError("%s: ranks %s are those of the global process set 0 (every rank); "
                         "use global_process_set" % (who, ranks))
    for set_id, others in sorted(registered.items()):
        if list(others) == ranks:
            raise ValueError("%s: ranks %s are those of process set %d, registered already; "
                             "a set's ranks must differ from every other set's"
                             % (who, ranks, set_id))
