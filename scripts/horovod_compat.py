#!/usr/bin/env python3
"""Runs Horovod's own test/parallel/test_torch.py against tutti.torch (a dev tool).

The test file is read from a Horovod checkout (default: the snapshot at
/work/.mirror/horovod+horovod/repo, tag v0.28.1, through `git show`) into a temporary
directory, next to a throwaway `horovod` package whose `horovod.torch` IS `tutti.torch`
and a small `common.py` with the three helpers the file imports. Nothing of Horovod's is
written into this repository. The file runs whole (one pytest session per rank) under each
launcher and size asked for, with a wall-clock deadline; the per-rank outcomes are merged
(a test passed when it passed on every rank, failed when it failed on any) and printed.

    scripts/horovod_compat.py --build build --python /opt/devvenv/bin/python
    scripts/horovod_compat.py --launchers tuttirun --sizes 3 -k allgather

Exit status: 0 when no test failed anywhere, 1 otherwise (or when a run reported no test
at all), 2 on a deadline. The launcher's
own exit status is shown but not judged: a rank exits 0 once its outcomes are saved.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ALIAS_INIT = '''"""Throwaway alias made by tutti's scripts/horovod_compat.py: horovod -> tutti."""
from tutti import __version__  # noqa: F401
'''

ALIAS_TORCH = '''import sys
import tutti.torch
sys.modules[__name__] = tutti.torch
'''

# The helpers test_torch.py imports from Horovod's test/utils/common.py, written anew.
COMMON = '''import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE"),
                               ("HOROVOD_RANK", "HOROVOD_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if os.environ.get("HOROVOD_TEST_GPU"):
        test.fail(message)
    test.skipTest(message)


@contextlib.contextmanager
def temppath():
    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
'''

# Each rank records every test's outcome in results.<rank>.json. After every test Tutti is
# shut down (as Horovod's own tearDown does when HOROVOD_RANK is set; every test calls
# hvd.init() first): a rank whose test failed early thus makes the others' pending ops fail
# at once ("rank N called shutdown") instead of at the deadline, and the next test starts
# with fresh state (no op left queued, unnamed-op counters from 0) on every rank.
CONFTEST = '''import json
import os

import pytest

import horovod.torch as hvd

_outcomes = {}


@pytest.fixture(autouse=True)
def _fresh_runtime_per_test():
    yield
    if hvd.is_initialized():
        hvd.shutdown()


def _rank():
    for var in ("OMPI_COMM_WORLD_RANK", "TUTTI_RANK", "PMI_RANK"):
        if var in os.environ:
            return os.environ[var]
    return "0"


def _save():
    path = os.path.join(os.path.dirname(__file__), "results.%s.json" % _rank())
    with open(path + ".tmp", "w") as out:
        json.dump(_outcomes, out)
    os.replace(path + ".tmp", path)


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1]
    if report.when == "call" or report.outcome != "passed":
        previous = _outcomes.get(name)
        if previous != "failed":
            _outcomes[name] = report.outcome
        if report.outcome == "failed":
            _outcomes[name + "#message"] = str(report.longrepr).splitlines()[-1:]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            _outcomes[name + "#message"] = [str(report.longrepr[2])]
    if report.when == "teardown":
        _save()  # as we go: a rank stopped by its launcher keeps what it ran


def pytest_sessionfinish(session, exitstatus):
    _save()
    # Wait for the other ranks (a launcher stops every rank when one exits non-zero), and
    # exit 0: the outcomes are in the results files.
    try:
        hvd.init()
        hvd.barrier()
        hvd.shutdown()
    except Exception:  # noqa: BLE001  (a rank that cannot sync still exits)
        pass
    session.exitstatus = 0
'''


def prepare(workdir, horovod_repo, ref):
    test_file = subprocess.run(
        ["git", "-C", horovod_repo, "show", "%s:test/parallel/test_torch.py" % ref],
        check=True, stdout=subprocess.PIPE).stdout
    with open(os.path.join(workdir, "test_torch.py"), "wb") as out:
        out.write(test_file)
    os.makedirs(os.path.join(workdir, "horovod", "torch"))
    for rel, text in (("horovod/__init__.py", ALIAS_INIT),
                      ("horovod/torch/__init__.py", ALIAS_TORCH),
                      ("common.py", COMMON), ("conftest.py", CONFTEST)):
        with open(os.path.join(workdir, rel), "w") as out:
            out.write(text)


def launch_argv(launcher, np, build, python, pytest_args):
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN",
              "test_torch.py"] + pytest_args
    if launcher == "mpirun":
        return ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none",
                "--mca", "btl", "self,vader", "-x", "PYTHONPATH", "-x",
                "TUTTI_TIMEOUT_SECONDS"] + pytest
    return [sys.executable, os.path.join(build, "launcher", "tuttirun"), "-np", str(np),
            "--gloo"] + pytest


def package_dir(build, python):
    """The build's tutti.torch for this interpreter's torch: build/python-torch<major>."""
    major = subprocess.run([python, "-c", "import torch; print(torch.__version__.split('.')[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    path = os.path.join(os.path.abspath(build), "python-torch" + major)
    if not os.path.isdir(path):
        sys.exit("horovod_compat: %s has no tutti.torch for torch %s.x (%s is missing)" %
                 (build, major, path))
    return path


def run_once(launcher, np, args, pytest_args):
    workdir = tempfile.mkdtemp(prefix="compat-horovod-")
    try:
        prepare(workdir, args.horovod_repo, args.ref)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([workdir, package_dir(args.build, args.python)])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["TUTTI_TIMEOUT_SECONDS"] = str(args.op_timeout)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        argv = launch_argv(launcher, np, os.path.abspath(args.build), args.python,
                           pytest_args)
        os.makedirs(args.log_dir, exist_ok=True)
        log_path = os.path.join(args.log_dir, "horovod_compat.%s.%d.log" % (launcher, np))
        start = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=args.deadline)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        elapsed = time.monotonic() - start
        per_rank = []
        for rank in range(np):
            path = os.path.join(workdir, "results.%d.json" % rank)
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        return rc, elapsed, per_rank, log_path
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def merge(per_rank):
    """test -> (outcome, message): failed on any rank beats skipped on all beats passed."""
    merged = {}
    names = sorted({n for r in per_rank if r for n in r if "#" not in n})
    for name in names:
        outcomes = [r.get(name, "missing") if r else "missing" for r in per_rank]
        if "failed" in outcomes or "missing" in outcomes:
            message = next((r.get(name + "#message") for r in per_rank
                            if r and r.get(name + "#message")), ["(missing on a rank)"])
            merged[name] = ("failed", message[0] if message else "")
        elif all(o == "skipped" for o in outcomes):
            message = next((r.get(name + "#message") for r in per_rank
                            if r.get(name + "#message")), [""])
            merged[name] = ("skipped", message[0] if message else "")
        else:
            merged[name] = ("passed", "")
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-repo", default="/work/.mirror/horovod+horovod/repo",
                        help="Horovod git checkout or bare repository")
    parser.add_argument("--ref", default="v0.28.1", help="Horovod tag or commit")
    parser.add_argument("--build", default="build", help="Tutti build directory")
    parser.add_argument("--python", default="/opt/devvenv/bin/python",
                        help="interpreter with torch and pytest")
    parser.add_argument("--launchers", default="mpirun,tuttirun")
    parser.add_argument("--sizes", default="2,3")
    parser.add_argument("--deadline", type=float, default=1200,
                        help="seconds for one whole run of the file")
    parser.add_argument("--op-timeout", type=int, default=20,
                        help="TUTTI_TIMEOUT_SECONDS for the ranks")
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset)")
    parser.add_argument("--show-skipped", action="store_true",
                        help="also list the skipped tests with their reasons")
    args = parser.parse_args()
    if os.sep in args.python:  # the ranks start in a temporary directory
        args.python = os.path.abspath(args.python)
    pytest_args = ["-k", args.keyword] if args.keyword else []

    status = 0
    for launcher in args.launchers.split(","):
        for np in (int(n) for n in args.sizes.split(",")):
            rc, elapsed, per_rank, log_path = run_once(launcher, np, args, pytest_args)
            merged = merge(per_rank)
            counts = {k: sum(1 for o, _ in merged.values() if o == k)
                      for k in ("passed", "skipped", "failed")}
            note = "DEADLINE" if rc is None else "rc=%d" % rc
            print("%-8s np=%d: %d passed, %d skipped, %d failed (%s, %.0f s, log %s)" % (
                launcher, np, counts["passed"], counts["skipped"], counts["failed"], note,
                elapsed, log_path), flush=True)
            for name, (outcome, message) in sorted(merged.items()):
                if outcome == "failed" or (outcome == "skipped" and args.show_skipped):
                    print("    %s %s: %s" % (outcome.upper(), name, message[:200]),
                          flush=True)
            if rc is None:
                status = 2
            elif counts["failed"] or not merged:  # nothing ran: the run itself failed
                status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
