"""horovodrun's flags that tuttirun accepts without acting on them, and those of work not built
yet, which stop with a pointer instead of argparse's "unrecognized arguments".
docs/launcher.md ("From horovodrun") lists every horovodrun flag against tuttirun's."""
import argparse
import sys

# Flags asking for what tuttirun does anyway: accepted, nothing to do. (flags, why)
ACCEPTED = [
    (["--disable-cache"], "tuttirun keeps no cache of start-up checks"),
    (["--no-torus-allreduce"], "Tutti has no torus allreduce"),
    (["--no-mpi-threads-disable"], "Tutti initializes MPI with the thread level it needs"),
]

# Flags of work not built yet: (flags, number of values, what, where to look).
NOT_YET = [
    (["--torus-allreduce"], 0, "torus allreduce", "docs/launcher.md"),
    (["--mpi-threads-disable"], 0, "choosing MPI's thread level", "docs/launcher.md"),
    (["--num-nccl-streams"], 1, "several NCCL streams", "docs/nccl.md"),
    (["--thread-affinity"], 1, "pinning the background thread", "docs/launcher.md"),
    (["--log-with-timestamp", "--log-without-timestamp"], 0, "log timestamps", "docs/launcher.md"),
    (["-prefix-timestamp", "--prefix-output-with-timestamp"], 0, "timestamped output",
     "docs/launcher.md"),
    (["--config-file"], 1, "a YAML config file (pass the flags instead)", "docs/launcher.md"),
    (["--jsrun"], 0, "launching with jsrun (use --mpi, or srun under Slurm)",
     "docs/launcher.md"),
]


class _NotYet(argparse.Action):
    def __init__(self, option_strings, dest, what, where, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.what, self.where = what, where

    def __call__(self, parser, namespace, values, option_string=None):
        print("tuttirun: error: %s: %s is not supported yet (see %s, and the table of "
              "horovodrun flags in docs/launcher.md)" % (option_string, self.what, self.where),
              file=sys.stderr, flush=True)
        sys.exit(2)


def add_horovodrun_flags(parser):
    """Registers ACCEPTED and NOT_YET on `parser` (hidden from --help)."""
    for flags, _why in ACCEPTED:
        parser.add_argument(*flags, action="store_true", dest="_accepted_%s" % flags[0][2:],
                            help=argparse.SUPPRESS)
    for flags, nargs, what, where in NOT_YET:
        parser.add_argument(*flags, action=_NotYet, what=what, where=where,
                            nargs=nargs if nargs else 0, dest="_not_yet_%s" % flags[-1][2:],
                            help=argparse.SUPPRESS)
