"""--bind-to: which CPUs each local worker may run on, as mpirun's --bind-to does.

`core` gives local rank i the i-th physical core of this host (all of its hardware
threads) among the CPUs tuttirun itself may use; `package` gives it the whole package
(socket) that core is on; `none` leaves every worker free to run anywhere. `auto` (the
default, as mpirun binds by default) is `core` where the host has at least one core per
local rank and `none` where it has fewer (oversubscribed: bound ranks would queue on the
cores they share instead of running wherever one is idle). TUTTI_BIND_TO in tuttirun's
environment replaces the default.

A rank bound to one core runs its whole process there: the training loop, torch's
threads, Tutti's background thread, gloo's. Binding keeps every rank's compute off the
other ranks' cores; docs/launcher.md ("Binding ranks to cores") and docs/PERFORMANCE.md
have what it does to a training step and a lone collective.
"""
import os

CHOICES = ("none", "core", "package", "auto")
DEFAULT = "auto"
ENV = "TUTTI_BIND_TO"


def default(environ=None):
    """The binding without --bind-to: TUTTI_BIND_TO if set, else DEFAULT. A value outside
    CHOICES raises ValueError naming the variable and the choices."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if not value:
        return DEFAULT
    if value not in CHOICES:
        raise ValueError("%s=%r: expected one of %s" % (ENV, value, ", ".join(CHOICES)))
    return value


def _read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def host_cores(cpus=None, sysfs="/sys/devices/system/cpu"):
    """This host's usable physical cores: [(package, [cpu, ...]), ...] in CPU order, from
    the CPUs tuttirun may run on (its affinity mask) and sysfs's topology. A CPU whose
    topology cannot be read counts as a core of its own in package 0."""
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(os.cpu_count() or 1))
    cores = {}
    order = []
    for cpu in sorted(cpus):
        base = os.path.join(sysfs, "cpu%d" % cpu, "topology")
        package = _read_int(os.path.join(base, "physical_package_id"))
        core = _read_int(os.path.join(base, "core_id"))
        key = (package or 0, core) if core is not None else (package or 0, "cpu%d" % cpu)
        if key not in cores:
            cores[key] = []
            order.append(key)
        cores[key].append(cpu)
    return [(key[0], cores[key]) for key in order]


def resolve(choice, local_size, cores):
    """The binding actually used: `auto` becomes `core` or `none`."""
    if choice == "auto":
        return "core" if 0 < local_size <= len(cores) else "none"
    return choice


def cpus_for(choice, local_rank, local_size, cores):
    """The CPUs local rank `local_rank` of `local_size` is bound to, or None (not bound).
    More local ranks than cores: core and package binding wrap around (as
    mpirun --oversubscribe --bind-to core does), so ranks share cores."""
    choice = resolve(choice, local_size, cores)
    if choice == "none" or not cores:
        return None
    package, cpus = cores[local_rank % len(cores)]
    if choice == "core":
        return sorted(cpus)
    return sorted(c for p, group in cores if p == package for c in group)


def describe(cpus):
    """"0-3,8" for [0, 1, 2, 3, 8]."""
    parts, start, prev = [], None, None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append("%d" % start if start == prev else "%d-%d" % (start, prev))
            start = prev = c
    if start is not None:
        parts.append("%d" % start if start == prev else "%d-%d" % (start, prev))
    return ",".join(parts)
