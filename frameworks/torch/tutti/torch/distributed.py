"""The torch.distributed backend "tutti" (docs/pytorch.md, "torch.distributed backend").

Importing tutti.torch (or this module) registers it with torch.distributed::

    import torch.distributed as dist
    import tutti.torch  # noqa: F401  registers backend "tutti"
    dist.init_process_group("tutti")   # env:// (torchrun), or init_method="tcp://..."/"file://..."
    model = torch.nn.parallel.DistributedDataParallel(model)

The backend (tutti/torch/_C, c10d_backend.cc) starts Tutti from the store torch's rendezvous
made (tutti_init_with_store), with torch's rank and size, and runs every collective on it:
CPU tensors only.

Under tuttirun or mpirun, where torch's own variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) are all unset, importing this module sets them from the launcher's, so that
``dist.init_process_group("tutti")`` needs no arguments there either (one host: see
``launcher_defaults``).
"""

import os
import zlib

import torch
import torch.distributed as dist

from tutti.torch import _C

BACKEND = "tutti"

# Why this build has no backend (torch 1.x has no c10d::Backend); None where it has one.
UNAVAILABLE = _C.C10D_BACKEND


def _create(store, rank, size, timeout):
    if UNAVAILABLE is not None:
        raise RuntimeError("tutti backend: " + UNAVAILABLE)
    return _C.make_c10d_backend(store, rank, size, timeout.total_seconds())


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
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    except TypeError:  # torch 1.x: no devices argument (and no c10d::Backend: _create says so)
        dist.Backend.register_backend(BACKEND, _create)


_TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _port_for(identity):
    # 20000-29999, below Linux's ephemeral ports: the same on every rank of the job.
    return 20000 + zlib.crc32(identity.encode()) % 10000


def launcher_defaults(environ=None):
    """torch.distributed's variables for env:// from tuttirun's or Open MPI's, or {}.

    Only where none of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT is set and every rank
    runs on one host (MASTER_ADDR 127.0.0.1; across hosts, set MASTER_ADDR and MASTER_PORT
    yourself). MASTER_PORT is derived from the job's identity (tuttirun's rendezvous server,
    Open MPI's job id), the same on every rank; set MASTER_PORT where it is taken.
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
_apply_launcher_defaults()
