"""tutti.torch built against one torch, imported by an interpreter with another.

Copies the build tree's package of one variant (built for BUILT_PYTHON's torch BUILT_VERSION)
into a temporary directory and imports it with OTHER_PYTHON, whose torch is OTHER_VERSION. That
must raise ImportError, exit 1 like any uncaught exception, and not abort or crash the
interpreter as loading the extension into the other torch does (std::system_error, rc 134; or
SIGSEGV); the message names both versions, both interpreters and the rebuild command for
OTHER_PYTHON. (Each interpreter imports its own variant in the Python tests.)

Usage: torch_mismatch_test.py PACKAGE_ROOT BUILT_VERSION BUILT_PYTHON OTHER_PYTHON OTHER_VERSION
"""
import os
import shutil
import subprocess
import sys
import tempfile


def run(python, root):
    env = dict(os.environ, PYTHONPATH=root, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([python, "-c", "import tutti.torch"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    package_root, built_version, built_python, other_python, other_version = sys.argv[1:]
    if other_version.split("+")[0] == built_version.split("+")[0]:
        sys.exit("%s has torch %s, the version the package was built for: no mismatch to test"
                 % (other_python, other_version))
    with tempfile.TemporaryDirectory(prefix="tutti-mismatch.") as root:
        shutil.copytree(os.path.join(package_root, "tutti"), os.path.join(root, "tutti"))
        other = run(other_python, root)
    last = other.stderr.strip().splitlines()[-1] if other.stderr.strip() else ""
    if other.returncode != 1:
        sys.exit("%s importing tutti.torch built for torch %s: expected ImportError (rc 1), got "
                 "rc %d (-6: abort, -11: SIGSEGV):\n%s"
                 % (other_python, built_version, other.returncode, other.stderr[-3000:]))
    expected = ["ImportError: tutti.torch was built against torch %s (for %s)"
                % (built_version, built_python),
                "%s imports torch %s" % (other_python, other_version),
                "Rebuild Tutti against torch %s: " % other_version,
                "-DTUTTI_TORCH_PYTHONS=%s" % other_python]
    missing = [e for e in expected if e not in last]
    if missing:
        sys.exit("the ImportError does not say %s; got:\n%s" % (missing, other.stderr[-3000:]))
    print("%s, torch %s: %s" % (other_python, other_version, last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
