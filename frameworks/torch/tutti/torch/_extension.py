"""The check `import tutti.torch` runs before it loads the extension _C.

_C is compiled against one torch's C++ API and ABI. Loaded into a process that imported
another torch it does not fail cleanly: the interpreter aborts (std::system_error, rc 134) or
crashes (SIGSEGV) inside the dynamic loader. So the version the build recorded in
_build_info.py is compared with torch.__version__ first, and a mismatch, a build without torch
and a missing torch each raise ImportError naming what was expected, what was found and the
command that rebuilds Tutti. Versions are compared without their local part ("2.13.0+cpu" and
"2.13.0+cu126" match): that names the CPU or CUDA flavour of the same release.
"""

import os
import sys

try:
    from tutti.torch import _build_info
except ImportError as e:
    raise ImportError(
        "tutti.torch in %s has no _build_info.py, which the build writes: that is the source "
        "tree; import a built copy (build/python-<variant> on PYTHONPATH, or an installed one)"
        % os.path.dirname(os.path.abspath(__file__))) from e


def _release(version):
    return version.split("+", 1)[0]


def _rebuild():
    return _build_info.REBUILD.format(python=sys.executable)


def check():
    """Raises ImportError unless the running interpreter's torch is the one _C was built for."""
    built = _build_info.TORCH_VERSION
    if built is None:
        raise ImportError(
            "tutti.torch is not available: this Tutti was built without torch (%s). Install "
            "torch into this environment (e.g. `%s -m pip install torch`), then rebuild Tutti "
            "so that it compiles tutti.torch against it: %s"
            % (_build_info.MISSING, sys.executable, _rebuild()))
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "tutti.torch was built against torch %s (for %s), but %s cannot import torch "
            "(%s: %s); install torch %s, or rebuild Tutti against the torch you have: %s"
            % (built, _build_info.PYTHON, sys.executable, type(e).__name__, e, built,
               _rebuild())) from e
    found = torch.__version__
    if _release(found) != _release(built):
        raise ImportError(
            "tutti.torch was built against torch %s (for %s), but %s imports torch %s (%s); "
            "an extension built for another torch would crash the interpreter, so it was not "
            "loaded. Rebuild Tutti against torch %s: %s"
            % (built, _build_info.PYTHON, sys.executable, found, torch.__file__, found,
               _rebuild()))
