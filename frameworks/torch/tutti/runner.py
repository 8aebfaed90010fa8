"""tutti.run(fn, ...): horovod.run's equivalent. Runs fn on every rank of a tuttirun job and
returns the list of the ranks' return values, in rank order (docs/pytorch.md, "tutti.run").

The caller pickles (fn, args, kwargs) into a temporary directory (with cloudpickle where it
is installed, which also carries functions defined in __main__ or inside other functions;
else with pickle, which needs fn importable by name); every worker runs
`python -m tutti._run_worker DIR`, calls fn and pickles its return value (or its traceback)
there. Importable without torch.
"""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import cloudpickle as _pickler
except ImportError:  # plain pickle: fn must be importable by name in the workers
    _pickler = pickle

_TASK = "task.pkl"


def find_tuttirun():
    """The tuttirun to start: $TUTTIRUN, else the one of the build tree this package sits
    in (build/python-torch<N>/tutti -> build/launcher/tuttirun), else the one installed
    next to this interpreter, else the first on PATH."""
    candidates = [os.environ.get("TUTTIRUN", "")]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "launcher", "tuttirun"))
    candidates.append(os.path.join(os.path.dirname(sys.executable), "tuttirun"))
    candidates.append(os.path.join(sys.prefix, "bin", "tuttirun"))
    candidates.append(shutil.which("tuttirun") or "")
    for path in candidates:
        if path and os.path.isfile(path):
            return os.path.abspath(path)
    raise RuntimeError("tutti.run: tuttirun not found (set TUTTIRUN, or install Tutti so "
                       "that tuttirun is on PATH); looked at: %s"
                       % ", ".join(p for p in candidates if p))


def _flags(num_proc, hosts, hostfile, use_gloo, use_mpi, mpi_args, start_timeout,
           ssh_port, ssh_identity_file, output_filename, verbose, network_interfaces,
           min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
           host_discovery_script):
    if hosts is not None and hostfile is not None:
        raise ValueError("tutti.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("tutti.run: use_gloo and use_mpi cannot both be True")
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError("tutti.run: num_proc must be a positive int, got %r" % (num_proc,))
    flags = ["-np", str(num_proc), "--mpi" if use_mpi else "--gloo"]
    if hosts is not None:
        flags += ["-H", hosts if isinstance(hosts, str) else ",".join(hosts)]
    if hostfile is not None:
        flags += ["--hostfile", hostfile]
    if network_interfaces:
        nics = network_interfaces
        flags += ["--network-interfaces", nics if isinstance(nics, str) else ",".join(nics)]
    for flag, value in (("--mpi-args", mpi_args), ("--start-timeout", start_timeout),
                        ("--ssh-port", ssh_port), ("--ssh-identity-file", ssh_identity_file),
                        ("--output-filename", output_filename),
                        ("--min-np", min_num_proc), ("--max-np", max_num_proc),
                        ("--slots", slots), ("--reset-limit", reset_limit),
                        ("--host-discovery-script", host_discovery_script)):
        if value is not None:
            flags += [flag, str(value)]
    if cooldown_range is not None:
        low, high = cooldown_range
        flags += ["--blacklist-cooldown-range", str(low), str(high)]
    if verbose:
        flags.append("--verbose")
    return flags


def run(fn, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None,
        ssh_identity_file=None, disable_cache=None, output_filename=None, verbose=None,
        use_gloo=None, use_mpi=None, mpi_args=None, network_interfaces=None,
        executable=None, np=None, min_np=None, max_np=None, timeout=None):
    """Runs fn(*args, **kwargs) on num_proc (or np) ranks under tuttirun and returns the
    list of their return values, indexed by rank (in an elastic job: the ranks that
    finished, by their last rank). The keywords are horovod.run's and map to tuttirun's
    flags (gloo unless use_mpi); disable_cache is accepted and has no effect (tuttirun
    keeps no check cache). executable: the workers' Python (default: this one). timeout:
    seconds for the whole job (default: none beyond the job's own deadlines). A rank that
    raises makes run() raise RuntimeError with that rank's traceback.
    """
    del disable_cache
    num_proc = np if np is not None else (num_proc if num_proc is not None else 1)
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    flags = _flags(num_proc, hosts, hostfile, use_gloo, use_mpi, mpi_args, start_timeout,
                   ssh_port, ssh_identity_file, output_filename, verbose, network_interfaces,
                   min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
                   host_discovery_script)
    workdir = tempfile.mkdtemp(prefix="tutti-run-")
    try:
        try:
            payload = _pickler.dumps((fn, tuple(args), dict(kwargs or {})))
        except Exception as error:
            raise ValueError("tutti.run: cannot pickle the function and its arguments (%s)%s"
                             % (error, "" if _pickler is not pickle else
                                "; without cloudpickle fn must be importable by name, "
                                "not defined in __main__ or inside a function")) from error
        with open(os.path.join(workdir, _TASK), "wb") as out:
            pickle.dump([os.path.abspath(p) for p in sys.path], out)
            out.write(payload)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        command = ([sys.executable, find_tuttirun()] + flags +
                   ["--", executable or sys.executable, "-m", "tutti._run_worker", workdir])
        try:
            code = subprocess.run(command, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired as error:
            raise RuntimeError("tutti.run: the job did not finish within %s s" % timeout) \
                from error
        return _collect(workdir, code, num_proc if min_num_proc is None else None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(workdir, code, expected):
    results, errors = {}, {}
    for entry in sorted(os.listdir(workdir)):
        kind, _, rank = entry.partition(".")
        if kind in ("result", "error") and rank.isdigit():
            with open(os.path.join(workdir, entry), "rb") as source:
                data = source.read()
            if kind == "result":
                results[int(rank)] = data
            else:
                errors[int(rank)] = data.decode("utf-8", "replace")
    if errors:
        first = min(errors)
        raise RuntimeError("tutti.run: fn raised on rank%s %s (tuttirun exit code %d); rank "
                           "%d:\n%s" % ("s" if len(errors) > 1 else "",
                                        ", ".join(map(str, sorted(errors))), code, first,
                                        errors[first]))
    if code != 0:
        raise RuntimeError("tutti.run: the job failed (tuttirun exit code %d; results from "
                           "ranks %s)" % (code, sorted(results)))
    ranks = sorted(results)
    if ranks != list(range(len(ranks))) or (expected is not None and len(ranks) != expected):
        raise RuntimeError("tutti.run: results from ranks %s, expected ranks 0..%s"
                           % (ranks, "%d" % (expected - 1) if expected else "n-1"))
    return [_pickler.loads(results[r]) for r in ranks]


def _worker_rank():
    torch_adapter = sys.modules.get("tutti.torch")
    if torch_adapter is not None and torch_adapter.is_initialized():
        return torch_adapter.rank()
    for variable in ("TUTTI_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


def _work(workdir):
    """A worker: runs the task of `workdir` and leaves result.<rank> or error.<rank>."""
    status = 0
    try:
        with open(os.path.join(workdir, _TASK), "rb") as source:
            # The caller's sys.path first, so that fn's module imports here as it did there.
            sys.path[:0] = [p for p in pickle.load(source) if p not in sys.path]
            fn, args, kwargs = _pickler.load(source)
        output = _pickler.dumps(fn(*args, **kwargs))
        kind = "result"
    except BaseException:  # noqa: BLE001  (reported to the caller, then this rank fails)
        output = traceback.format_exc().encode("utf-8")
        kind = "error"
        status = 1
    rank = _worker_rank()
    partial = os.path.join(workdir, "%s.%d.partial" % (kind, rank))
    with open(partial, "wb") as out:
        out.write(output)
    os.replace(partial, os.path.join(workdir, "%s.%d" % (kind, rank)))
    return status


def main(argv):
    if len(argv) != 1 or not os.path.isfile(os.path.join(argv[0], _TASK)):
        sys.exit("usage: python -m tutti._run_worker DIR (a directory that tutti.run "
                 "prepared)")
    return _work(argv[0])
