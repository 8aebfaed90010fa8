"""The import-time check of the TensorFlow the op library was built for, and the build flags."""

import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import tutti.tensorflow as hvd
from tutti.tensorflow import _build_info, _extension


def test_built_for_this_tensorflow():
    assert _build_info.TF_VERSION == tf.__version__
    _extension.check(tf.__version__)


def test_other_tensorflow_names_both_versions():
    with pytest.raises(ImportError) as info:
        _extension.check("2.99.0")
    message = str(info.value)
    assert _build_info.TF_VERSION in message and "2.99.0" in message, message
    assert "Rebuild" in message


def test_cpu_only_build_says_so():
    assert hvd.nccl_built() == 0 and not hvd.cuda_built()


@pytest.mark.skipif("hvd.size() > 1")
def test_mismatched_build_refused_at_import(tmp_path):
    """A copy of the package whose build info names another TensorFlow: `import
    tutti.tensorflow` raises ImportError naming both versions, without loading the library."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__))))
    shutil.copytree(os.path.join(root, "tutti"), tmp_path / "tutti")
    info = tmp_path / "tutti" / "tensorflow" / "_build_info.py"
    text = info.read_text().replace('TF_VERSION = "%s"' % tf.__version__,
                                    'TF_VERSION = "2.15.0"')
    info.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", "import tutti.tensorflow"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "ImportError" in proc.stderr
    assert "2.15.0" in proc.stderr and tf.__version__ in proc.stderr, proc.stderr
