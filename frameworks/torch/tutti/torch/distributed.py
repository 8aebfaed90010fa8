"""The torch.distributed backend "tutti" (docs/pytorch.md, "torch.distributed backend").

Importing tutti.torch (or this module) registers it with torch.distributed::

    import torch.distributed as dist
    import tutti.torch  # noqa: F401  registers backend "tutti"
    dist.init_process_group("tutti")   # env:// (torchrun), or init_method="tcp://..."/"file://..."
    model = torch.nn.parallel.DistributedDataParallel(model)

The backend (tutti/torch/_C, c10d_backend.cc) starts Tutti from the store torch's rendezvous
made (tutti_init_with_store), with torch's rank and size, and runs every collective on it:
CPU tensors only.

A group of some ranks (``new_group(ranks)``, ``new_subgroups``, a ``DeviceMesh`` dimension)
runs on a Tutti process set. c10d makes groups in the same order on every rank, members or
not, but calls a backend's creator on the members only; so this module wraps c10d's group
maker to add the set (collectively, on every rank) before the members' backends are made,
and ``destroy_process_group()`` to remove those sets again. It also lets
``monitored_barrier`` through for groups on "tutti" (torch's lets gloo's alone through).

Under tuttirun, mpirun or srun, where torch's own variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) are all unset, importing this module sets them from the launcher's, so that
``dist.init_process_group("tutti")`` needs no arguments there either (one host: see
``launcher_defaults``).
"""

import datetime
import os
import zlib

import torch
import torch.distributed as dist

from tutti.torch import _C

BACKEND = "tutti"

# Why this build has no backend (torch 1.x has no c10d::Backend); None where it has one.
UNAVAILABLE = _C.C10D_BACKEND


# torch's group name -> {ranks (a tuple): the Tutti process set added for them}: usually one
# entry, more where ranks made the same-named group of different ranks (new_subgroups(group=)
# of a subgroup: each parent's members split theirs).
_group_sets = {}


def _create(opts, *_backend_options):
    """The creator of c10d's extended API: a backend for one group (on its members only)."""
    if UNAVAILABLE is not None:
        raise RuntimeError("tutti backend: " + UNAVAILABLE)
    ranks = list(opts.global_ranks_in_group)  # [] for the world's (default) group
    process_set = 0
    if ranks and len(ranks) < dist.get_world_size():
        process_set = _group_sets.get(opts.group_id, {}).get(tuple(ranks))
        if process_set is None:
            raise RuntimeError(
                "tutti backend: process group '%s' of ranks %s has no Tutti process set (it "
                "was not made through torch.distributed's group maker after importing "
                "tutti.torch)" % (opts.group_id, ranks))
    return _C.make_c10d_backend(opts.store, opts.group_rank, opts.group_size,
                                opts.timeout.total_seconds(), process_set, opts.group_id)


def _on_tutti(backend):
    c10d = dist.distributed_c10d
    try:
        return BACKEND in c10d.BackendConfig(c10d.Backend(backend)).get_device_backend_map() \
            .values()
    except (ValueError, AssertionError):
        return False


def _wrap_group_maker(make):
    """c10d's _new_process_group_helper, which every rank calls for every new group (members
    or not: it returns NON_GROUP_MEMBER to the others), adding a group of some ranks on
    "tutti" as a Tutti process set first, collectively."""
    def make_group(group_size, group_rank, global_ranks_in_group, backend, store, group_name,
                   *args, **kwargs):
        ranks = list(global_ranks_in_group)
        if ranks and len(ranks) < dist.get_world_size() and _on_tutti(backend):
            _add_group_set(group_name, ranks)
        return make(group_size, group_rank, global_ranks_in_group, backend, store, group_name,
                    *args, **kwargs)
    make_group._tutti_wrapped = make
    return make_group


def _group_views(group_name, ranks, what):
    """Every rank's ranks for this group (c10d lets ranks outside a parent group make a
    same-named group of other ranks), in rank order, checked: each member of a rank's
    group must see the same group."""
    import tutti.torch  # the package, loaded by the time groups are made
    world = dist.get_world_size()
    mine = torch.zeros(world, dtype=torch.uint8)
    mine[ranks] = 1
    rows = tutti.torch.allgather(mine.unsqueeze(0), name="c10d.groups." + group_name)
    views = [tuple(int(i) for i in row.nonzero().flatten()) for row in rows]
    for r, view in enumerate(views):
        for member in view:
            if views[member] != view:
                raise RuntimeError(
                    "%s: ranks disagree on the group's ranks: rank %d passes %s, but its "
                    "member rank %d passes %s" % (what, r, list(view), member,
                                                  list(views[member])))
    return views


def _add_group_set(group_name, ranks):
    c10d = dist.distributed_c10d
    what = "tutti backend: new_group(ranks=%s) (process group '%s')" % (ranks, group_name)
    if group_name == c10d._hash_ranks_to_str(ranks):
        raise ValueError(what + ": use_local_synchronization=True is not supported (adding "
                         "the group's Tutti process set is collective over every rank)")
    if not _C.is_initialized():
        raise RuntimeError(what + ": Tutti is not running: a group of some ranks needs the "
                           "world's group on tutti (init_process_group('tutti')), or "
                           "tutti.torch.init() first")
    if group_name in _group_sets:
        raise RuntimeError(what + ": a group of that name already has process set %d"
                           % _group_sets[group_name])
    views = sorted(set(_group_views(group_name, ranks, what)))
    sets = {}
    try:
        for view in views:
            sets[view] = _C.add_process_set(list(view))
    except Exception as e:  # a core error (ranks that disagree, Tutti stopped): name the group
        raise RuntimeError("%s: adding its Tutti process set failed: %s" % (what, e)) from e
    finally:
        _group_sets[group_name] = sets  # what was added, removed with the world's group


def _wrap_destroy(destroy):
    """destroy_process_group(): then removes every process set of _group_sets, on every
    rank (each takes part in destroying the world's group; removing a set is collective, so
    destroying one group, which its members alone do, leaves its set until then)."""
    def destroy_process_group(group=None):
        everything = group is None or group is dist.GroupMember.WORLD
        destroy(group)
        if not everything:
            return
        sets = sorted(i for views in _group_sets.values() for i in views.values())
        _group_sets.clear()
        if _C.is_initialized():  # else Tutti was shut down with the last backend
            for set_id in sets:
                _C.remove_process_set(set_id)
    destroy_process_group._tutti_wrapped = destroy
    return destroy_process_group


def _wrap_monitored_barrier(monitored_barrier):
    """monitored_barrier(group, timeout, wait_all_ranks): torch's for other backends; for a
    group on "tutti", the backend's (torch's refuses every backend but gloo)."""
    def tutti_monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        c10d = dist.distributed_c10d
        if c10d._rank_not_in_group(group) or not _on_tutti(dist.get_backend(group)):
            return monitored_barrier(group=group, timeout=timeout,
                                     wait_all_ranks=wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(BACKEND)
        elif isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    tutti_monitored_barrier.__doc__ = monitored_barrier.__doc__
    tutti_monitored_barrier._tutti_wrapped = monitored_barrier
    return tutti_monitored_barrier


def _install_wrappers():
    """Wraps c10d's group maker, destroy_process_group and monitored_barrier (once), where
    torch.distributed has them; torch.distributed's names follow distributed_c10d's."""
    if UNAVAILABLE is not None or not dist.is_available():
        return
    c10d = dist.distributed_c10d
    for name, wrap in (("_new_process_group_helper", _wrap_group_maker),
                       ("destroy_process_group", _wrap_destroy),
                       ("monitored_barrier", _wrap_monitored_barrier)):
        current = getattr(c10d, name, None)
        if current is None or hasattr(current, "_tutti_wrapped"):
            continue
        wrapped = wrap(current)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is current:
            setattr(dist, name, wrapped)


def is_registered():
    """Whether torch.distributed knows the backend "tutti" (after importing tutti.torch)."""
    if not dist.is_available():
        return False
    names = getattr(dist.Backend, "backend_list", None)  # torch 1.x has none
    return BACKEND in names if names is not None else hasattr(dist.Backend, BACKEND.upper())


def register():
    """Registers the backend "tutti" with torch.distributed; a second call does nothing."""
    if not dist.is_available() or is_registered():
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    except TypeError:  # torch 1.x: no devices argument (and no c10d::Backend: _create says so)
        dist.Backend.register_backend(BACKEND, _create, extended_api=True)


_TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _port_for(identity):
    # 20000-29999, below Linux's ephemeral ports: the same on every rank of the job.
    return 20000 + zlib.crc32(identity.encode()) % 10000


def launcher_defaults(environ=None):
    """torch.distributed's variables for env:// from tuttirun's, Open MPI's or Slurm's, or {}.

    Only where none of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT is set and every rank
    runs on one host (MASTER_ADDR 127.0.0.1; across hosts, set MASTER_ADDR and MASTER_PORT
    yourself). MASTER_PORT is derived from the job's identity (tuttirun's rendezvous server,
    Open MPI's job id, Slurm's job and step ids), the same on every rank; set MASTER_PORT
    where it is taken.
    """
    env = os.environ if environ is None else environ
    if any(v in env for v in _TORCH_VARS):
        return {}
    if "TUTTI_RANK" in env and "TUTTI_SIZE" in env:
        rank, size = env["TUTTI_RANK"], env["TUTTI_SIZE"]
        local_rank, local_size = env.get("TUTTI_LOCAL_RANK"), env.get("TUTTI_LOCAL_SIZE")
        identity = "tuttirun:%s:%s" % (env.get("TUTTI_RENDEZVOUS_ADDR", ""),
                                       env.get("TUTTI_RENDEZVOUS_PORT", ""))
    elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        rank, size = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
        local_rank = env.get("OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
        identity = "openmpi:%s" % env.get("PMIX_NAMESPACE",
                                          env.get("OMPI_MCA_ess_base_jobid", ""))
    elif ("SLURM_PROCID" in env and "SLURM_STEP_ID" in env and
          "SLURM_STEP_NUM_TASKS" in env):
        # A task of a job step (srun), as Tutti's own topology reads it: a program run
        # straight from an sbatch script has SLURM_PROCID too, but is one process.
        rank, size = env["SLURM_PROCID"], env["SLURM_STEP_NUM_TASKS"]
        local_rank = env.get("SLURM_LOCALID")
        local_size = size if env.get("SLURM_STEP_NUM_NODES") == "1" else None
        identity = "slurm:%s.%s" % (env.get("SLURM_JOB_ID", ""), env["SLURM_STEP_ID"])
    else:
        return {}
    if local_size != size:  # ranks on several hosts: rank 0's address is not known here
        return {}
    out = {"RANK": rank, "WORLD_SIZE": size, "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port_for(identity))}
    if local_rank is not None and "LOCAL_RANK" not in env:
        out["LOCAL_RANK"] = local_rank
    return out


def _apply_launcher_defaults():
    for name, value in launcher_defaults().items():
        os.environ[name] = value


register()
_install_wrappers()
_apply_launcher_defaults()
