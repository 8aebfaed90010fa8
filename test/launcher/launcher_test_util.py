"""Shared by the launcher tests: where tuttirun is, and how to run it with a deadline."""
import os
import subprocess
import sys

TUTTIRUN = os.environ.get("TUTTIRUN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "launcher", "tuttirun")
LIB_DIR = os.path.dirname(os.path.realpath(TUTTIRUN))
if LIB_DIR not in sys.path:
    sys.path.insert(0, LIB_DIR)
PYTHON = sys.executable


def run(args, timeout=60, env=None, **kwargs):
    """Runs tuttirun to completion; returns CompletedProcess with text stdout/stderr."""
    return subprocess.run([PYTHON, TUTTIRUN] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


def alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
