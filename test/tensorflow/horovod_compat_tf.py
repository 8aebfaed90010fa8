#!/usr/bin/env python3
"""Runs Horovod's own TensorFlow and Keras test files (test/parallel/test_tensorflow.py by
default) against tutti.tensorflow and tutti.keras (a dev tool, not a CI test: the files have
hundreds of tests and take minutes).

As scripts/horovod_compat.py does for torch: the test file and the shared base class it
imports (test/parallel/base_test_tensorflow.py) are read from a Horovod checkout (default: the
snapshot at /work/.mirror/horovod+horovod/repo, tag v0.28.1, through `git show`) into a
temporary directory, next to a throwaway `horovod` package whose `horovod.tensorflow` IS
`tutti.tensorflow` (and `horovod.keras`, `horovod.tensorflow.keras` are `tutti.keras`), with
the two helpers of Horovod's own the files import (`horovod.common.util.
is_version_greater_equal_than`, `horovod.runner.common.util.env.get_env_rank_and_size`) written
anew. Nothing of Horovod's is written into this repository. The run, the per-rank outcome
files and their merge are scripts/horovod_compat.py's.

    test/tensorflow/horovod_compat_tf.py --build build --python .venv-torch/bin/python
    test/tensorflow/horovod_compat_tf.py --launchers tuttirun --sizes 2 -k allgather
    test/tensorflow/horovod_compat_tf.py --file test_tensorflow_process_sets.py --sizes 2,3

On legacy Keras 2 (tf-keras) set TF_USE_LEGACY_KERAS=1 for the run (the launchers pass it to
every rank): the files' `tf.keras`, `tutti.keras` and `tutti.tensorflow.keras` are then Keras
2's (docs/keras.md has the results):

    TF_USE_LEGACY_KERAS=1 test/tensorflow/horovod_compat_tf.py --file test_tensorflow2_keras.py

--file picks one of FILES_AVAILABLE. The files whose test class initializes Horovod once
(with static process sets, in setUpClass; the Keras files when their tests are constructed)
run without the harness's shutdown after every test. The Keras files need `parameterized`
(scripts/setup.sh installs it).
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
ALIAS_KERAS = '''import sys
import tutti.keras
sys.modules[__name__] = tutti.keras
'''
# Written anew: what the files import from Horovod's own package besides the frameworks.
HOROVOD_COMMON_UTIL = '''from packaging import version


def is_version_greater_equal_than(ver, target):
    if not (isinstance(ver, str) and isinstance(target, str)):
        raise ValueError("is_version_greater_equal_than takes two strings, got %r and %r"
                         % (ver, target))
    return version.parse(ver) >= version.parse(target)
'''
HOROVOD_RUNNER_ENV = '''import os


def get_env_rank_and_size():
    for rank_var, size_var in (("HOROVOD_RANK", "HOROVOD_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError("only one of %s and %s is set" % (rank_var, size_var))
    return 0, 1
'''
FILES_AVAILABLE = ("test_tensorflow.py", "test_tensorflow_process_sets.py",
                   "test_tensorflow_process_sets_dynamic.py", "test_tensorflow2_keras.py",
                   "test_tensorflow2_keras_process_sets.py", "test_tensorflow_keras.py",
                   "test_keras.py")
# These initialize Horovod once per class (setUpClass) or when pytest collects them (the
# Keras files call hvd.init() in their TestCase's __init__): no shutdown between their tests.
INIT_ONCE = ("test_tensorflow_process_sets.py", "test_tensorflow2_keras_process_sets.py",
             "test_tensorflow2_keras.py", "test_tensorflow_keras.py", "test_keras.py")
TEST_FILE = "test_tensorflow.py"


def _take_file_option(argv):
    """Removes --file NAME from argv (the rest is scripts/horovod_compat.py's) and returns NAME."""
    name = TEST_FILE
    for i, arg in enumerate(argv):
        if arg == "--file" or arg.startswith("--file="):
            name = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv)
                                                             else "")
            del argv[i:i + (1 if "=" in arg else 2)]
            break
    if name not in FILES_AVAILABLE:
        sys.exit("horovod_compat_tf: --file: expected one of %s, got %r"
                 % (", ".join(FILES_AVAILABLE), name))
    return name


def prepare(workdir, horovod_repo, ref):
    for path in ("test/parallel/" + TEST_FILE, "test/parallel/base_test_tensorflow.py"):
        text = subprocess.run(["git", "-C", horovod_repo, "show", "%s:%s" % (ref, path)],
                              check=True, stdout=subprocess.PIPE).stdout
        with open(os.path.join(workdir, os.path.basename(path)), "wb") as out:
            out.write(text)
    for d in ("horovod/tensorflow/keras", "horovod/keras", "horovod/common",
              "horovod/runner/common/util"):
        os.makedirs(os.path.join(workdir, d))
    conftest = compat.CONFTEST.replace("horovod.torch", "horovod.tensorflow")
    if TEST_FILE in INIT_ONCE:
        per_test = "    if hvd.is_initialized():\n        hvd.shutdown()\n"
        assert per_test in conftest, "scripts/horovod_compat.py's conftest changed"
        conftest = conftest.replace(per_test, "    pass\n", 1)
    for rel, text in (("horovod/__init__.py", compat.ALIAS_INIT),
                      ("horovod/tensorflow/__init__.py", ALIAS_TF),
                      ("horovod/tensorflow/util.py", ALIAS_TF_UTIL),
                      ("horovod/tensorflow/keras/__init__.py", ALIAS_TF_KERAS),
                      ("horovod/keras/__init__.py", ALIAS_KERAS),
                      ("horovod/common/__init__.py", ""),
                      ("horovod/common/util.py", HOROVOD_COMMON_UTIL),
                      ("horovod/runner/__init__.py", ""),
                      ("horovod/runner/common/__init__.py", ""),
                      ("horovod/runner/common/util/__init__.py", ""),
                      ("horovod/runner/common/util/env.py", HOROVOD_RUNNER_ENV),
                      ("common.py", compat.COMMON), ("conftest.py", conftest)):
        with open(os.path.join(workdir, rel), "w") as out:
            out.write(text)


_original_launch_argv = compat.launch_argv


def compat_launch_argv(launcher, np, build, python, pytest_args):
    argv = _original_launch_argv(launcher, np, build, python, pytest_args)
    return [(TEST_FILE if a == "test_torch.py" else a) for a in argv]


def package_dir(build, python):
    path = os.path.join(os.path.abspath(build), "python-tensorflow")
    if not os.path.isdir(path):
        sys.exit("horovod_compat_tf: %s has no tutti.tensorflow (%s is missing)" % (build, path))
    return path


if __name__ == "__main__":
    TEST_FILE = _take_file_option(sys.argv)
    compat.prepare = prepare
    compat.launch_argv = compat_launch_argv
    compat.package_dir = package_dir
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(compat.main())
