#!/usr/bin/env python3
"""Runs Horovod's own elastic integration tests (test/integration/test_elastic_torch.py) against
tuttirun and tutti.torch (a dev tool, docs/elastic.md "Horovod's elastic tests").

The test file, its elastic_common.py and data/elastic_torch_main.py are read from a Horovod
checkout (default: the snapshot at /work/.mirror/horovod+horovod/repo, tag v0.28.1, through
`git show`) into a temporary directory, next to a throwaway `horovod` package: its
`horovod.torch` IS `tutti.torch`, and its `horovod.runner.launch._run_elastic` runs tuttirun
with the test's horovodrun flags (the test's patched DISCOVER_HOSTS_FREQUENCY_SECS and
ELASTIC_TIMEOUT_SECS become --discovery-interval and --elastic-timeout) and raises what
horovodrun raises for the outcome tuttirun reports. Nothing of Horovod's is written into this
repository. All eight scenarios of the file run, the four that Horovod skips for torch with
the shared test's own code; one fix is made to the test: test_min_hosts_timeout passes
`np=4`, a parameter `_run` lacks, which is taken as its `num_proc`.

    scripts/horovod_elastic.py --build build
    scripts/horovod_elastic.py -k single_rank_failure --repeat 3

Exit status: 0 when every scenario passed in every repetition, 1 otherwise.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HOROVOD_FILES = ("test/integration/test_elastic_torch.py", "test/integration/elastic_common.py",
                 "test/integration/data/elastic_torch_main.py")

ALIAS = {
    "horovod/__init__.py": '"""Throwaway alias made by tutti\'s scripts/horovod_elastic.py."""\n',
    "horovod/torch/__init__.py": "import sys\nimport tutti.torch\n"
                                 "sys.modules[__name__] = tutti.torch\n",
    "horovod/runner/__init__.py": "",
    "horovod/runner/common/__init__.py": "",
    "horovod/runner/common/util/__init__.py": "",
    # The test exports its arguments to an env dict it never uses: nothing to do.
    "horovod/runner/common/util/config_parser.py": "def set_env_from_args(env, args):\n"
                                                   "    return env\n",
    "horovod/runner/elastic/__init__.py": "",
    # A pattern of tuttirun's own message (the test matches the message with it).
    "horovod/runner/elastic/constants.py":
        "RESET_LIMIT_EXCEEDED_MESSAGE = r'reset limit reached: .* \\(--reset-limit {}\\)'\n",
    # Patched by the test; read by launch._run_elastic when it starts tuttirun.
    "horovod/runner/elastic/driver.py": "DISCOVER_HOSTS_FREQUENCY_SECS = 1.0\n"
                                        "ELASTIC_TIMEOUT_SECS = 600\n",
    "horovod/runner/gloo_run.py": "def _get_min_start_hosts(settings):\n    return 1\n",
    "mock.py": "import sys\nfrom unittest import mock\nsys.modules[__name__] = mock\n",
}

LAUNCH = '''"""horovodrun's entry points as the elastic tests call them, run by tuttirun."""
import os
import signal
import subprocess
import sys
import threading
import time

from horovod.runner.elastic import driver

TUTTIRUN = os.environ["HOROVOD_ELASTIC_TUTTIRUN"]
LOG = os.environ["HOROVOD_ELASTIC_LOG"]
DEADLINE = float(os.environ.get("HOROVOD_ELASTIC_DEADLINE", "180"))
# What horovodrun raises when a worker failed and the job did not finish.
NON_ZERO = "Horovod detected that one or more processes exited with non-zero status"


def parse_args():
    return list(sys.argv[1:])


def _run_elastic(args):
    command = args.index("python")
    argv = [sys.executable, TUTTIRUN] + args[:command] + [
        "--discovery-interval", str(driver.DISCOVER_HOSTS_FREQUENCY_SECS),
        "--elastic-timeout", str(driver.ELASTIC_TIMEOUT_SECS), "--"] + args[command:]
    with open(LOG, "ab") as log:
        log.write(("\\n=== %s\\n" % " ".join(argv)).encode())
        log.flush()
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timer = threading.Timer(DEADLINE, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        lines = []
        try:
            for line in proc.stdout:  # each line with the seconds since tuttirun started
                lines.append(line)
                log.write(b"%7.2f " % (time.monotonic() - start) + line)
        finally:
            timer.cancel()
            proc.wait()
        log.write(("=== tuttirun exited with %d after %.1f s\\n" % (
            proc.returncode, time.monotonic() - start)).encode())
    out = b"".join(lines)
    if proc.returncode == -signal.SIGKILL:
        raise TimeoutError("tuttirun did not end within %g s" % DEADLINE)
    if proc.returncode == 0:
        return None
    errors = [line for line in out.decode(errors="replace").splitlines()
              if line.startswith("tuttirun: error: ")]
    message = errors[-1] if errors else "tuttirun exited with code %d" % proc.returncode
    if "reset limit reached" not in message and "failed worker(s): " in message:
        raise RuntimeError("%s (%s)" % (NON_ZERO, message))
    raise RuntimeError(message)
'''

# Runs every scenario of the file, the ones ElasticTorchTests skips with the shared code.
RUNNER = '''import elastic_common
import test_elastic_torch

_run = elastic_common.BaseElasticTests._run


def _run_with_np(self, *args, np=None, **kwargs):
    if np is not None:  # test_min_hosts_timeout's np=4: its num_proc
        kwargs.setdefault("num_proc", np)
    return _run(self, *args, **kwargs)


elastic_common.BaseElasticTests._run = _run_with_np


class ElasticTorchAllTests(test_elastic_torch.ElasticTorchTests):
    pass


for _name in dir(elastic_common.BaseElasticTests):
    if _name.startswith("test_"):
        setattr(ElasticTorchAllTests, _name, getattr(elastic_common.BaseElasticTests, _name))
'''

COMMON = '''import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def override_args(tool=None, *args):
    saved = sys.argv
    sys.argv = ([tool] if tool else []) + list(args)
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def temppath():
    fd, path = tempfile.mkstemp()
    os.close(fd)
    os.remove(path)  # the tests append to it, or write it whole
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
'''


def prepare(workdir, args):
    integration = os.path.join(workdir, "integration")
    os.makedirs(os.path.join(integration, "data"))
    for path in HOROVOD_FILES:
        text = subprocess.run(["git", "--git-dir", args.horovod_repo, "show",
                               "%s:%s" % (args.ref, path)],
                              check=True, stdout=subprocess.PIPE).stdout
        with open(os.path.join(integration, path[len("test/integration/"):]), "wb") as out:
            out.write(text)
    files = dict(ALIAS)
    files["horovod/runner/launch.py"] = LAUNCH
    files["integration/test_all_scenarios.py"] = RUNNER
    files["common.py"] = COMMON
    for rel, text in files.items():
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(text)
    bindir = os.path.join(workdir, "bin")  # the tests start workers as `python`
    os.makedirs(bindir)
    os.symlink(args.python, os.path.join(bindir, "python"))
    return integration


def package_dir(build, python):
    major = subprocess.run([python, "-c", "import torch; print(torch.__version__.split('.')[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    path = os.path.join(os.path.abspath(build), "python-torch" + major)
    if not os.path.isdir(path):
        sys.exit("horovod_elastic: %s has no tutti.torch for torch %s.x" % (build, major))
    return path


def run_once(args, index):
    workdir = tempfile.mkdtemp(prefix="elastic-horovod-")
    try:
        integration = prepare(workdir, args)
        log_path = os.path.join(args.log_dir, "horovod_elastic.%d.log" % index)
        open(log_path, "w").close()
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([workdir, package_dir(args.build, args.python)]),
                   PATH=os.path.join(workdir, "bin") + os.pathsep + os.environ["PATH"],
                   HOROVOD_ELASTIC_TUTTIRUN=os.path.join(os.path.abspath(args.build),
                                                         "launcher", "tuttirun"),
                   HOROVOD_ELASTIC_LOG=log_path,
                   HOROVOD_ELASTIC_DEADLINE=str(args.deadline))
        junit = os.path.join(workdir, "junit.xml")
        argv = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--junitxml", junit, "test_all_scenarios.py"]
        if args.keyword:
            argv += ["-k", args.keyword]
        with open(log_path, "ab") as log:
            subprocess.run(argv, cwd=integration, env=env, stdout=log,
                           stderr=subprocess.STDOUT, timeout=args.deadline * 12)
        results = []
        for case in ET.parse(junit).getroot().iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            skipped = case.find("skipped")
            outcome = "failed" if failure is not None else (
                "skipped" if skipped is not None else "passed")
            message = (failure.get("message") if failure is not None else "") or ""
            results.append((case.get("name"), outcome, float(case.get("time", 0)),
                            message.splitlines()[0][:200] if message else ""))
        return results, log_path
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-repo", default="/work/.mirror/horovod+horovod/repo")
    parser.add_argument("--ref", default="v0.28.1")
    parser.add_argument("--build", default="build", help="Tutti build directory")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter with torch, pytest and psutil for the workers")
    parser.add_argument("--deadline", type=float, default=180,
                        help="seconds for one tuttirun job of a scenario")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset)")
    args = parser.parse_args()
    table = {}
    for index in range(args.repeat):
        start = time.monotonic()
        results, log_path = run_once(args, index)
        print("run %d: %.0f s, log %s" % (index + 1, time.monotonic() - start, log_path),
              flush=True)
        for name, outcome, seconds, message in results:
            print("    %-60s %-7s %5.1f s %s" % (name, outcome, seconds, message), flush=True)
            table.setdefault(name, []).append(outcome)
    print("\n| scenario | passed |\n|---|---|")
    for name, outcomes in sorted(table.items()):
        print("| %s | %d of %d |" % (name, outcomes.count("passed"), len(outcomes)))
    return 0 if table and all(o == "passed" for v in table.values() for o in v) else 1


if __name__ == "__main__":
    sys.exit(main())
