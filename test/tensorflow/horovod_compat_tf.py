#!/usr/bin/env python3
"""Runs Horovod's own test/parallel/test_tensorflow.py against tutti.tensorflow (a dev tool,
not a CI test: the file has ~250 tests and takes minutes).

As scripts/horovod_compat.py does for torch: the test file and the shared base class it
imports (test/parallel/base_test_tensorflow.py) are read from a Horovod checkout (default: the
snapshot at /work/.mirror/horovod+horovod/repo, tag v0.28.1, through `git show`) into a
temporary directory, next to a throwaway `horovod` package whose `horovod.tensorflow` IS
`tutti.tensorflow`. Nothing of Horovod's is written into this repository. The run, the
per-rank outcome files and their merge are scripts/horovod_compat.py's.

    test/tensorflow/horovod_compat_tf.py --build build --python .venv-torch/bin/python
    test/tensorflow/horovod_compat_tf.py --launchers tuttirun --sizes 2 -k allgather
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import horovod_compat as compat  # noqa: E402

ALIAS_TF = '''import sys
import tutti.tensorflow
sys.modules[__name__] = tutti.tensorflow
'''
ALIAS_TF_KERAS = '''import sys
import tutti.tensorflow.keras
sys.modules[__name__] = tutti.tensorflow.keras
'''
ALIAS_TF_UTIL = '''import sys
import tutti.tensorflow.util
sys.modules[__name__] = tutti.tensorflow.util
'''
FILES = ("test/parallel/test_tensorflow.py", "test/parallel/base_test_tensorflow.py")


def prepare(workdir, horovod_repo, ref):
    for path in FILES:
        text = subprocess.run(["git", "-C", horovod_repo, "show", "%s:%s" % (ref, path)],
                              check=True, stdout=subprocess.PIPE).stdout
        with open(os.path.join(workdir, os.path.basename(path)), "wb") as out:
            out.write(text)
    os.makedirs(os.path.join(workdir, "horovod", "tensorflow", "keras"))
    conftest = compat.CONFTEST.replace("horovod.torch", "horovod.tensorflow")
    for rel, text in (("horovod/__init__.py", compat.ALIAS_INIT),
                      ("horovod/tensorflow/__init__.py", ALIAS_TF),
                      ("horovod/tensorflow/util.py", ALIAS_TF_UTIL),
                      ("horovod/tensorflow/keras/__init__.py", ALIAS_TF_KERAS),
                      ("common.py", compat.COMMON), ("conftest.py", conftest)):
        with open(os.path.join(workdir, rel), "w") as out:
            out.write(text)


_original_launch_argv = compat.launch_argv


def compat_launch_argv(launcher, np, build, python, pytest_args):
    argv = _original_launch_argv(launcher, np, build, python, pytest_args)
    return [("test_tensorflow.py" if a == "test_torch.py" else a) for a in argv]


def package_dir(build, python):
    path = os.path.join(os.path.abspath(build), "python-tensorflow")
    if not os.path.isdir(path):
        sys.exit("horovod_compat_tf: %s has no tutti.tensorflow (%s is missing)" % (build, path))
    return path


if __name__ == "__main__":
    compat.prepare = prepare
    compat.launch_argv = compat_launch_argv
    compat.package_dir = package_dir
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(compat.main())
