"""horovodrun's flags that ask for what Tutti does not have: accepted, and each one given (on
the command line or in --config-file) gets one line saying what Tutti does instead, never
argparse's "unrecognized arguments". docs/launcher.md ("From horovodrun") lists every
horovodrun flag against tuttirun's."""
import argparse
import sys

# (flags, dest, type of the value or None for a switch, what Tutti does instead)
IGNORED = [
    (["--disable-cache"], "disable_cache", None,
     "tuttirun keeps no cache of start-up checks; there is nothing to disable"),
    (["--torus-allreduce"], "torus_allreduce", None,
     "Tutti has no torus allreduce; across hosts it runs its hierarchical allreduce "
     "(TUTTI_HIERARCHICAL_ALLREDUCE, on by default) or one flat ring"),
    (["--mpi-threads-disable"], "mpi_threads_disable", None,
     "Tutti's MPI backend needs MPI_THREAD_MULTIPLE and asks for it; a program that "
     "initializes MPI itself (mpi4py) must ask for it too, or run with --gloo"),
    (["--num-nccl-streams"], "num_nccl_streams", int,
     "Tutti runs each NCCL communicator on one CUDA stream of its own (docs/nccl.md)"),
    (["--thread-affinity"], "thread_affinity", int,
     "Tutti does not pin its background thread; pin whole ranks instead (--bind-to core "
     "or package; --binding-args with --mpi; or taskset/numactl in the command)"),
    (["--autotune-steps-per-sample"], "autotune_steps_per_sample", int,
     "Tutti's autotune scores time windows, not steps (TUTTI_AUTOTUNE_WINDOW_SECONDS, "
     "default 0.5; set it with -x)"),
    (["--autotune-bayes-opt-max-samples"], "autotune_bayes_opt_max_samples", int,
     "Tutti's autotune is a coordinate search, not Bayesian optimization; it scores "
     "TUTTI_AUTOTUNE_SAMPLES windows per candidate (default 3; set it with -x)"),
    (["--autotune-gaussian-process-noise"], "autotune_gaussian_process_noise", float,
     "Tutti's autotune fits no Gaussian process; it takes the median of "
     "TUTTI_AUTOTUNE_SAMPLES windows per candidate"),
]
# The switches' opposites ask for what Tutti does anyway: accepted without a word.
OPPOSITES = [(["--no-torus-allreduce"], "torus_allreduce"),
             (["--no-mpi-threads-disable"], "mpi_threads_disable")]
JSRUN_NOTICE = "Tutti does not launch with jsrun; it runs the job with mpirun, as --mpi"


def add_horovodrun_flags(parser):
    """Registers IGNORED and OPPOSITES on `parser` (hidden from --help: docs/launcher.md
    lists them)."""
    opposites = {dest: flags for flags, dest in OPPOSITES}
    for flags, dest, kind, _what in IGNORED:
        if kind is not None:
            parser.add_argument(*flags, dest=dest, type=kind, metavar="N",
                                help=argparse.SUPPRESS)
            continue
        # A switch and its opposite exclude each other, as in horovodrun.
        group = parser.add_mutually_exclusive_group() if dest in opposites else parser
        group.add_argument(*flags, dest=dest, action="store_const", const=True,
                           help=argparse.SUPPRESS)
        if dest in opposites:
            group.add_argument(*opposites[dest], dest=dest, action="store_const",
                               const=False, help=argparse.SUPPRESS)


def print_notices(args, out=None):
    """One line for each ignored setting given (a switch only when on), and for --jsrun."""
    out = out or sys.stderr
    for flags, dest, kind, what in IGNORED:
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        shown = flags[0] if kind is None else "%s %s" % (flags[0], value)
        print("tuttirun: note: %s: %s" % (shown, what), file=out, flush=True)
    if getattr(args, "jsrun", False):
        print("tuttirun: note: --jsrun: %s" % JSRUN_NOTICE, file=out, flush=True)
