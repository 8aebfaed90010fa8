"""The mpirun (Open MPI) command equivalent to a tuttirun invocation."""
import os
import shlex

# Open MPI's daemons notice a host that stopped answering (its link down, say) by TCP
# keepalive: by default after 300 + 9 x 20 s, 8 minutes in which mpirun waits. tuttirun asks
# for 5 + 5 x 2 s, so that a job with a lost host ends within about 15 s of the loss
# (mpirun: "ORTE has lost communication with a remote daemon ... node h2").
KEEPALIVE = [("oob_tcp_keepalive_time", "5"), ("oob_tcp_keepalive_intvl", "2"),
             ("oob_tcp_keepalive_probes", "5")]


class MpiOptions:
    """What tuttirun's flags add to mpirun's command line."""

    def __init__(self, output_dir=None, nics=None, tcp=False, binding_args=None,
                 extra_args=None, remote=False):
        self.output_dir = output_dir
        self.nics = nics or []          # --network-interface(s): pin MPI's TCP traffic
        self.tcp = tcp                  # --tcp: the TCP BTL only
        self.binding_args = binding_args  # replaces --bind-to none
        self.extra_args = extra_args    # --mpi-args, split like a shell
        self.remote = remote            # hosts other than this one: keepalive on


def mpirun_command(np, hosts, env, command, options=None, mpirun="mpirun", cores=None):
    """hosts: [(name, slots)] or None; env: variables to export with -x NAME=VALUE (-x NAME
    where the value is None: mpirun passes its own)."""
    options = options or MpiOptions()
    cores = cores if cores is not None else (os.cpu_count() or 1)
    extra = shlex.split(options.extra_args) if options.extra_args else []
    argv = [mpirun, "-np", str(np)]
    if hosts:
        argv += ["-H", ",".join("%s:%d" % h for h in hosts)]
    # Without -H, Open MPI offers one slot per core; with it, the listed slots.
    slots = sum(count for _, count in hosts) if hosts else cores
    if np > slots:
        argv.append("--oversubscribe")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += shlex.split(options.binding_args) if options.binding_args else ["--bind-to", "none"]
    argv.append("--tag-output")
    if options.output_dir:
        argv += ["--output-filename", options.output_dir]
    params = []
    if options.nics:
        names = ",".join(options.nics)
        params += [("btl_tcp_if_include", names), ("oob_tcp_if_include", names)]
    if options.tcp:
        params += [("pml", "ob1"), ("btl", "tcp,self")]
    if options.remote:
        params += KEEPALIVE
    for name, value in params:
        if name not in extra:  # the user's --mpi-args value wins
            argv += ["--mca", name, value]
    for name in sorted(env):
        argv += ["-x", name if env[name] is None else "%s=%s" % (name, env[name])]
    return argv + extra + list(command)
