"""The mpirun (Open MPI) command equivalent to a tuttirun invocation."""
import os


def mpirun_command(np, hosts, env, command, output_dir=None, mpirun="mpirun", cores=None):
    """hosts: [(name, slots)] or None; env: variables to export with -x NAME=VALUE (-x NAME
    where the value is None: mpirun passes its own)."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    argv = [mpirun, "-np", str(np)]
    if hosts:
        argv += ["-H", ",".join("%s:%d" % h for h in hosts)]
    # Without -H, Open MPI offers one slot per core; with it, the listed slots.
    slots = sum(count for _, count in hosts) if hosts else cores
    if np > slots:
        argv.append("--oversubscribe")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--bind-to", "none", "--tag-output"]
    if output_dir:
        argv += ["--output-filename", output_dir]
    for name in sorted(env):
        argv += ["-x", name if env[name] is None else "%s=%s" % (name, env[name])]
    return argv + list(command)
