"""tuttirun's command line: parse, then run the job with gloo (default) or mpirun."""
import argparse
import json
import os
import secrets
import shlex
import signal
import sys

from . import binding
from . import hosts as hostlib
from . import config_file
from .compat import add_horovodrun_flags, print_notices
from .elastic import ElasticError, discover, run_elastic
from .environment import forwarded_environment, local_environment, remote_environment
from .mpi import MpiOptions, mpirun_command, run_mpirun
from .rendezvous import RendezvousServer
from .spawn import SECRET_ENV, Job, OutputForwarder, remote_command

# Flags that only set a TUTTI_* variable in every worker: (flag, variable, converter).
SETTINGS = [
    ("fusion_threshold_mb", "TUTTI_FUSION_THRESHOLD", lambda v: str(int(v * 1024 * 1024))),
    ("cycle_time_ms", "TUTTI_CYCLE_TIME_MS", str),
    ("timeline_filename", "TUTTI_TIMELINE", str),
    ("timeline_mark_cycles", "TUTTI_TIMELINE_MARK_CYCLES", lambda v: "1" if v else "0"),
    ("autotune", "TUTTI_AUTOTUNE", lambda v: "1" if v else "0"),
    ("autotune_log_file", "TUTTI_AUTOTUNE_LOG", str),
    ("autotune_warmup_samples", "TUTTI_AUTOTUNE_WARMUP_WINDOWS", str),
    ("hierarchical_allreduce", "TUTTI_HIERARCHICAL_ALLREDUCE", lambda v: "1" if v else "0"),
    ("hierarchical_allgather", "TUTTI_HIERARCHICAL_ALLGATHER", lambda v: "1" if v else "0"),
    ("cache_capacity", "TUTTI_CACHE_CAPACITY", str),
    ("stall_check_warning_time_seconds", "TUTTI_STALL_CHECK_TIME_SECONDS", str),
    ("stall_check_shutdown_time_seconds", "TUTTI_STALL_SHUTDOWN_TIME_SECONDS", str),
    ("log_level", "TUTTI_LOG_LEVEL", str),
    ("log_with_timestamp", "TUTTI_LOG_HIDE_TIME", lambda v: "0" if v else "1"),
    ("start_timeout", "TUTTI_START_TIMEOUT_SECONDS", str),
]
LOG_LEVELS = ["trace", "debug", "info", "warning", "error", "fatal"]


def make_parser():
    p = argparse.ArgumentParser(
        prog="tuttirun", usage="tuttirun -np N [options] command [args...]",
        description="Launch a Tutti job: N copies of COMMAND with ranks, rendezvous and "
                    "secret in their environment. See docs/launcher.md.",
        epilog="horovodrun's other flags are accepted too; those asking for what Tutti does "
               "not have say in one line what it does instead (docs/launcher.md, 'From "
               "horovodrun').")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of processes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default localhost:NP)")
    where.add_argument("-hostfile", "--hostfile", help="file of 'host slots=N' lines")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--gloo", action="store_true", help="gloo over TCP (the default)")
    how.add_argument("--mpi", action="store_true", help="run the equivalent mpirun command")
    how.add_argument("--jsrun", action="store_true", help=argparse.SUPPRESS)  # as --mpi
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of remote hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh private key for remote hosts")
    p.add_argument("-x", dest="export", action="append", default=[], metavar="VAR[=VALUE]",
                   help="pass VAR (from this environment, or set to VALUE) to every worker")
    p.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                   help="fusion buffer size (TUTTI_FUSION_THRESHOLD, in bytes)")
    p.add_argument("--cycle-time-ms", type=float, metavar="MS",
                   help="batching bound of one round (TUTTI_CYCLE_TIME_MS)")
    p.add_argument("--timeline-filename", metavar="DIR/|FILE",
                   help="write a Chrome-tracing timeline (TUTTI_TIMELINE): DIR/ gives every "
                        "rank DIR/rank-N.json (merge: tutti-timeline merge DIR -o job.json); "
                        "a FILE is written by rank 0")
    cycles = p.add_mutually_exclusive_group()
    cycles.add_argument("--timeline-mark-cycles", action="store_const", const=True,
                        help="mark every round on the timeline (TUTTI_TIMELINE_MARK_CYCLES=1)")
    cycles.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles",
                        action="store_const", const=False, help=argparse.SUPPRESS)
    tune = p.add_mutually_exclusive_group()
    tune.add_argument("--autotune", action="store_const", const=True,
                      help="tune fusion threshold and cycle time while the job runs "
                           "(TUTTI_AUTOTUNE=1)")
    tune.add_argument("--no-autotune", dest="autotune", action="store_const", const=False,
                      help=argparse.SUPPRESS)
    p.add_argument("--autotune-log-file", metavar="FILE",
                   help="rank 0 writes each autotune window as CSV (TUTTI_AUTOTUNE_LOG)")
    p.add_argument("--autotune-warmup-samples", type=int, metavar="N",
                   help="autotune windows at the start that are not scored "
                        "(TUTTI_AUTOTUNE_WARMUP_WINDOWS)")
    hier = p.add_mutually_exclusive_group()
    hier.add_argument("--hierarchical-allreduce", dest="hierarchical_allreduce",
                      action="store_const", const=True,
                      help="allreduce in two levels (shm inside hosts, the network across) "
                           "where every host runs as many ranks (TUTTI_HIERARCHICAL_ALLREDUCE=1, "
                           "the default)")
    hier.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                      action="store_const", const=False,
                      help="one flat ring across hosts (TUTTI_HIERARCHICAL_ALLREDUCE=0)")
    hier_ag = p.add_mutually_exclusive_group()
    hier_ag.add_argument("--hierarchical-allgather", dest="hierarchical_allgather",
                         action="store_const", const=True,
                         help="allgather across hosts first, then over shm inside each host, "
                              "where every host runs as many ranks "
                              "(TUTTI_HIERARCHICAL_ALLGATHER=1, the default)")
    hier_ag.add_argument("--no-hierarchical-allgather", dest="hierarchical_allgather",
                         action="store_const", const=False,
                         help="one flat ring across hosts for allgather "
                              "(TUTTI_HIERARCHICAL_ALLGATHER=0)")
    p.add_argument("--cache-capacity", type=int, metavar="N",
                   help="response cache entries, 0 = off (TUTTI_CACHE_CAPACITY)")
    p.add_argument("--stall-check-warning-time-seconds", type=float, metavar="S",
                   help="warn about stalled tensors (TUTTI_STALL_CHECK_TIME_SECONDS)")
    p.add_argument("--stall-check-shutdown-time-seconds", type=float, metavar="S",
                   help="fail after a stall this long (TUTTI_STALL_SHUTDOWN_TIME_SECONDS)")
    stall = p.add_mutually_exclusive_group()
    stall.add_argument("--no-stall-check", action="store_const", const=True,
                       help="disable the stall check (TUTTI_STALL_CHECK_DISABLE=1)")
    stall.add_argument("--stall-check", dest="no_stall_check", action="store_const",
                       const=False, help="keep the stall check on (the default)")
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, metavar="LEVEL",
                   help="TUTTI_LOG_LEVEL, in any case: %s" % ", ".join(LOG_LEVELS))
    stamp = p.add_mutually_exclusive_group()
    stamp.add_argument("--log-with-timestamp", dest="log_with_timestamp", action="store_const",
                       const=True, help="Tutti's log lines start with the date and time "
                                        "(TUTTI_LOG_HIDE_TIME=0)")
    stamp.add_argument("--log-without-timestamp", dest="log_with_timestamp",
                       action="store_const", const=False,
                       help="log lines without the time (TUTTI_LOG_HIDE_TIME=1, the default)")
    stamp.add_argument("--no-log-hide-timestamp", dest="log_with_timestamp",
                       action="store_const", const=True, help=argparse.SUPPRESS)
    stamp.add_argument("--log-hide-timestamp", dest="log_with_timestamp",
                       action="store_const", const=False, help=argparse.SUPPRESS)
    p.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                   help="start each forwarded output line with the local time")
    p.add_argument("--config-file", metavar="FILE",
                   help="horovodrun's YAML config file; flags on the command line win")
    p.add_argument("--start-timeout", type=float, metavar="S",
                   help="deadline of connecting: ssh, rendezvous, connections (exported as "
                        "TUTTI_START_TIMEOUT_SECONDS, default 30); collectives have their own "
                        "deadline, TUTTI_TIMEOUT_SECONDS (default 30 minutes)")
    p.add_argument("--gloo-timeout-seconds", type=float, metavar="S",
                   help="horovodrun's name for the same deadline (the larger of the two wins)")
    p.add_argument("--network-interface", dest="nics", action="append", metavar="IFACE",
                   help="interface for the job's traffic (gloo, MPI, NCCL) and the rendezvous "
                        "server; may be repeated")
    p.add_argument("--network-interfaces", "--nics", dest="nics", metavar="IFACE,...",
                   action=_CommaList, help="the same, as a comma-separated list")
    mpi = p.add_argument_group("--mpi only")
    mpi.add_argument("--mpi-args", metavar="'ARGS'",
                     help="more arguments for mpirun, e.g. --mpi-args='--map-by ppr:2:node'")
    mpi.add_argument("--tcp", action="store_true",
                     help="MPI over TCP only (--mca pml ob1 --mca btl tcp,self; gloo is TCP "
                          "anyway), and NCCL too (NCCL_IB_DISABLE=1)")
    mpi.add_argument("--binding-args", metavar="'ARGS'",
                     help="mpirun's binding arguments instead of --bind-to")
    p.add_argument("--bind-to", choices=binding.CHOICES, metavar="WHAT",
                   help="bind each local worker to a core, to its core's package, or not at "
                        "all: %s (default auto, or TUTTI_BIND_TO: core where this host has a "
                        "core per local rank, else none); under --mpi, mpirun's --bind-to" %
                        ", ".join(binding.CHOICES))
    p.add_argument("--output-filename", metavar="DIR",
                   help="also write DIR/rank.N/stdout and DIR/rank.N/stderr")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print the backends and frameworks this build has, and exit")
    p.add_argument("--verbose", action="store_true", help="print what is started")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (or the mpirun command) without starting anything")
    el = p.add_argument_group("elastic jobs (docs/elastic.md); any of these makes the job "
                              "elastic")
    el.add_argument("--min-np", "--min-num-proc", type=int, metavar="N",
                    help="fewest workers the job runs with (default: -np)")
    el.add_argument("--max-np", "--max-num-proc", type=int, metavar="N",
                    help="most workers the job grows to (default: every free slot)")
    el.add_argument("--host-discovery-script", metavar="SCRIPT",
                    help="prints the usable hosts, one 'host:slots' (or 'host') per line; "
                         "run every --discovery-interval seconds")
    el.add_argument("--slots", "--slots-per-host", type=int, metavar="N",
                    help="slots of a discovered host that names none (default 1)")
    el.add_argument("--elastic-timeout", type=float, default=600.0, metavar="S",
                    help="how long the job waits with fewer than --min-np workers before it "
                         "fails (default 600)")
    el.add_argument("--reset-limit", type=int, metavar="N",
                    help="fail after N new generations (worker failures, host changes)")
    el.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"),
                    help="seconds a host whose worker failed gets no workers: MIN, doubling "
                         "with each failure there up to MAX (default 60 600)")
    el.add_argument("--keep-host-workers", action="store_true", help="a failed worker's host "
                    "keeps its other workers (default: they are stopped, as horovodrun does)")
    el.add_argument("--discovery-interval", type=float, default=1.0, metavar="S",
                    help="seconds between runs of the discovery script (default 1)")
    add_horovodrun_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


class _CommaList(argparse.Action):
    """--network-interfaces eth0,eth1: appends each name."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [n.strip() for n in values.split(",") if n.strip()]
        if not names:
            parser.error("%s: expected interface names, got %r" % (option_string, values))
        setattr(namespace, self.dest, (getattr(namespace, self.dest) or []) + names)


def fail(message, code=2):
    print("tuttirun: error: " + message, file=sys.stderr, flush=True)
    sys.exit(code)


def build_info(lib_dir):
    path = os.path.join(lib_dir, "build_info.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def check_build(lib_dir):
    info = build_info(lib_dir)
    built = {name: bool(info.get(name)) for name in ("mpi", "gloo", "nccl", "torch")}
    source = "build configuration"
    library = info.get("library")
    if library and not os.path.exists(library):
        # Installed under another prefix than configured: look next to share/tutti.
        import glob
        prefix = os.path.normpath(os.path.join(lib_dir, "..", "..", ".."))
        found = sorted(glob.glob(os.path.join(prefix, "lib*", "libtutti.so*")) +
                       glob.glob(os.path.join(prefix, "lib*", "*", "libtutti.so*")))
        library = found[0] if found else None
    if library and os.path.exists(library):
        try:  # the library's own answer wins over the configure-time record
            import ctypes
            lib = ctypes.CDLL(library)
            lib.tutti_backend_built.argtypes = [ctypes.c_char_p]
            for name in ("mpi", "gloo", "nccl"):
                built[name] = bool(lib.tutti_backend_built(name.encode()))
            source = library
        except (OSError, AttributeError):
            pass
    mark = lambda flag: "[X]" if flag else "[ ]"
    print("Tutti v%s (from %s):\n" % (info.get("version", "?"), source))
    print("Available Frameworks:\n    %s PyTorch" % mark(built["torch"]))
    print("Available Controllers:\n    %s MPI\n    %s Gloo" % (mark(built["mpi"]),
                                                           mark(built["gloo"])))
    print("Available Tensor Operations:\n    %s NCCL\n    %s MPI\n    %s Gloo" % (
        mark(built["nccl"]), mark(built["mpi"]), mark(built["gloo"])))
    return 0


def settings_env(args):
    env = {}
    for attr, var, convert in SETTINGS:
        value = getattr(args, attr)
        if value is not None:
            env[var] = convert(value)
    if args.nics:
        env["TUTTI_GLOO_IFACE"] = args.nics[0]  # gloo uses one interface
        if "NCCL_SOCKET_IFNAME" not in os.environ:  # NCCL's own sockets (GPU jobs)
            env["NCCL_SOCKET_IFNAME"] = ",".join(args.nics)
    if args.no_stall_check:
        env["TUTTI_STALL_CHECK_DISABLE"] = "1"
    if args.tcp:  # as horovodrun: NCCL's sockets, not InfiniBand
        env["NCCL_IB_DISABLE"] = "1"
    if env:  # tutti-info and the info log name these as set by tuttirun
        env["TUTTI_LAUNCHER_SETTINGS"] = ",".join(sorted(env))
    for item in args.export:
        name, eq, value = item.partition("=")
        if not name or not (name.replace("_", "a").isalnum() and not name[0].isdigit()):
            fail("-x %r: expected VAR or VAR=VALUE" % item)
        if eq:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
        else:
            print("tuttirun: warning: -x %s: not set here, not passed" % name,
                  file=sys.stderr)
    if SECRET_ENV in env or "TUTTI_SECRET_FILE" in env:
        fail("the job secret is generated by tuttirun; do not pass it with -x")
    return env


def forwarder(args):
    return OutputForwarder(args.output_filename, timestamp=args.prefix_output_with_timestamp)


def run_mpi(args, host_list, env):
    env = dict(env, TUTTI_CPU_OPERATIONS="mpi")
    remote = bool(host_list) and not all(hostlib.is_local(h) for h, _ in host_list)
    if remote:
        # mpirun passes remote ranks only what -x names: name the whole environment (by
        # name only: mpirun reads the values from its own environment, off the command line).
        env = dict(dict.fromkeys(forwarded_environment()), **env)
    binding_args = args.binding_args
    if binding_args is None and args.bind_to is None and binding.ENV not in os.environ:
        # The default: mpirun's own (a core each up to 2 ranks, where not oversubscribed),
        # so that tuttirun --mpi runs a job as plain mpirun does, on remote hosts too.
        binding_args = ""
    elif binding_args is None:
        # As the gloo path binds: auto looks at the largest number of ranks on one host.
        most = max(min(np_, args.np) for _, np_ in host_list) if host_list else args.np
        how = binding.resolve(args.binding, most, binding.host_cores())
        binding_args = "--bind-to %s" % how
    elif args.bind_to is not None:
        fail("--bind-to and --binding-args: give one of them")
    options = MpiOptions(output_dir=args.output_filename, nics=args.nics, tcp=args.tcp,
                         binding_args=binding_args, extra_args=args.mpi_args,
                         remote=remote)
    argv = mpirun_command(args.np, host_list, env, args.command, options)
    if args.verbose or args.dry_run:
        print("tuttirun: " + " ".join(shlex.quote(a) for a in argv), flush=True)
    if args.dry_run:
        return 0
    return run_mpirun(argv, timestamp=args.prefix_output_with_timestamp)


def run_gloo(args, host_list, env):
    slots = hostlib.place(host_list, args.np)
    local = {h: hostlib.is_local(h) for h, _ in host_list}
    if all(local[s.host] for s in slots):
        address = "127.0.0.1"
    elif args.nics:
        address = hostlib.interface_address(args.nics[0])
    else:
        address = hostlib.address_toward(next(s.host for s in slots if not local[s.host]))
    secret = secrets.token_hex(32)  # 32 random bytes, only ever in environments and pipes
    env = dict(env, TUTTI_CPU_OPERATIONS="gloo", TUTTI_RENDEZVOUS_ADDR=address)
    cores = binding.host_cores()
    here = [s for s in slots if local[s.host]]  # (under one or more names of this host)
    bound = {s.rank: binding.cpus_for(args.binding, i, len(here), cores)
             for i, s in enumerate(here)}
    if args.dry_run:
        for s in slots:
            where = "local" if local[s.host] else "ssh"
            if bound.get(s.rank):
                where += ", CPUs %s" % binding.describe(bound[s.rank])
            print("tuttirun: rank %d on %s (%s): %s" % (s.rank, s.host, where, " ".join(
                "%s=%s" % kv for kv in sorted(dict(env, **s.env(args.np)).items()))))
        return 0
    # Bound and listening now; its threads start after the workers (see spawn.py).
    server = RendezvousServer(bytes.fromhex(secret), host=address)
    env["TUTTI_RENDEZVOUS_PORT"] = str(server.port)
    job = Job(forwarder(args))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, job.on_signal)
    try:
        for s in slots:
            worker_env = dict(env, **s.env(args.np))
            if args.verbose:
                print("tuttirun: starting rank %d on %s%s: %s" % (
                    s.rank, s.host, ", CPUs " + binding.describe(bound[s.rank])
                    if bound.get(s.rank) else "",
                    " ".join(shlex.quote(a) for a in args.command)),
                    file=sys.stderr, flush=True)
            if local[s.host]:
                job.start_local(s, args.command, local_environment(worker_env, secret),
                                bound[s.rank])
            else:
                argv, stdin = remote_command(s.host, args.command,
                                             remote_environment(worker_env), os.getcwd(),
                                             secret, args.ssh_port, args.ssh_identity_file,
                                             args.start_timeout or 30)
                job.start_remote(s, argv, stdin)
            if job.interrupted is not None:
                break
    except OSError as e:
        print("tuttirun: cannot start rank %d (%s): %s" % (s.rank, args.command[0], e),
              file=sys.stderr, flush=True)
        job.forward_output()
        job.stop()
        server.stop()
        return 127
    job.forward_output()
    server.start()
    code = job.wait()
    server.stop()
    return code


def is_elastic(args):
    return any(v is not None for v in (args.min_np, args.max_np, args.host_discovery_script,
                                       args.reset_limit, args.blacklist_cooldown_range))


def run_gloo_elastic(args, host_list, env):
    if args.mpi:
        fail("elastic jobs run over gloo; drop --mpi")
    if args.bind_to not in (None, "none"):
        print("tuttirun: warning: --bind-to applies to fixed-size jobs only; the workers of "
              "an elastic job are not bound", file=sys.stderr, flush=True)
    try:
        if args.host_discovery_script:
            first = discover(args.host_discovery_script, args.slots or 1, 30.0)
        else:
            first = host_list or [("localhost", args.np)]
    except ElasticError as e:
        fail(str(e), 1)
    remote = [h for h, _ in first if not hostlib.is_local(h)]
    if args.nics:
        address = hostlib.interface_address(args.nics[0])
    elif remote:
        address = hostlib.address_toward(remote[0])
    else:
        address = "127.0.0.1"
    if args.dry_run:
        print("tuttirun: elastic job, rendezvous at %s, hosts now: %s" % (
            address, ", ".join("%s:%d" % h for h in first)))
        return 0
    secret = secrets.token_hex(32)
    server = RendezvousServer(bytes.fromhex(secret), host=address)
    env = dict(env, TUTTI_CPU_OPERATIONS="gloo", TUTTI_RENDEZVOUS_ADDR=address,
               TUTTI_RENDEZVOUS_PORT=str(server.port))
    try:
        return run_elastic(args, env, secret, server, forwarder(args))
    except ElasticError as e:
        server.stop()
        fail(str(e), 1)


# Settings that must not be negative, as horovodrun checks them (flag or config file).
NON_NEGATIVE = ["fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                "autotune_warmup_samples", "autotune_steps_per_sample",
                "autotune_bayes_opt_max_samples", "stall_check_warning_time_seconds",
                "stall_check_shutdown_time_seconds", "num_nccl_streams", "thread_affinity",
                "gloo_timeout_seconds"]


def read_config_file(args):
    """--config-file: the file's settings where the command line gave none."""
    given = {attr for attr, value in vars(args).items() if value is not None}
    try:
        data = config_file.load(args.config_file)
        warnings = config_file.apply(args, data, args.config_file, given)
    except config_file.ConfigFileError as e:
        fail("--config-file " + str(e))
    for warning in warnings:
        print("tuttirun: warning: --config-file " + warning, file=sys.stderr, flush=True)


def check_settings(args):
    for attr in NON_NEGATIVE:
        value = getattr(args, attr)
        if value is not None and value < 0:
            fail("--%s %s: expected a value >= 0" % (attr.replace("_", "-"), value))
    noise = args.autotune_gaussian_process_noise
    if noise is not None and not 0 <= noise <= 1:
        fail("--autotune-gaussian-process-noise %s: expected a value in [0, 1]" % noise)


def main(argv=None, lib_dir=None):
    args = make_parser().parse_args(argv)
    if args.config_file:
        read_config_file(args)
    check_settings(args)
    print_notices(args)
    if args.jsrun:
        args.mpi = True
    lib_dir = lib_dir or os.path.dirname(os.path.abspath(__file__))
    if args.version:
        print("tuttirun (Tutti) %s" % build_info(lib_dir).get("version", "unknown"))
        return 0
    if args.check_build:
        return check_build(lib_dir)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.np is None or args.np < 1:
        fail("-np N (N >= 1) is required")
    if not args.command:
        fail("no command to run")
    if args.gloo_timeout_seconds is not None:
        args.start_timeout = max(args.start_timeout or 0, args.gloo_timeout_seconds)
    try:
        args.binding = args.bind_to or binding.default()
    except ValueError as e:
        fail(str(e))
    if not args.mpi:
        # (--tcp asks gloo for nothing new: it runs over TCP.)
        for flag, value in (("--mpi-args", args.mpi_args), ("--binding-args", args.binding_args)):
            if value:
                print("tuttirun: warning: %s applies to --mpi only; ignored" % flag,
                      file=sys.stderr, flush=True)
    try:
        if args.hosts:
            host_list = hostlib.parse_hosts(args.hosts)
        elif args.hostfile:
            host_list = hostlib.parse_hostfile(args.hostfile)
        else:
            host_list = None
        env = settings_env(args)
        if is_elastic(args):
            return run_gloo_elastic(args, host_list, env)
        if args.mpi:
            return run_mpi(args, host_list, env)
        return run_gloo(args, host_list or [("localhost", args.np)], env)
    except (hostlib.HostError, OSError) as e:
        fail(str(e))
