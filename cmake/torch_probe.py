"""Prints, one `key=value` line each (lists joined by "|"), what CMake needs to build the
tutti.torch extension against the torch this interpreter imports. Exits 1 with the import error on stderr when
torch cannot be imported. Run by cmake/TuttiTorch.cmake; standard library + torch only."""
import os
import sys
import sysconfig

try:
    import torch
except Exception as e:  # noqa: BLE001 - any failure means "no usable torch here"
    print("%s: %s" % (type(e).__name__, e), file=sys.stderr)
    sys.exit(1)

defines = ["_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
# torch 1.x builds its extensions with these pybind11 ABI tags; torch 2.x dropped them.
for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    value = getattr(torch._C, "_PYBIND11_" + name, None)
    if value is not None:
        defines.append('PYBIND11_%s="%s"' % (name, value))

print("version=" + torch.__version__)
print("major=" + torch.__version__.split(".")[0])
# The paths torch.utils.cpp_extension uses, computed here: that module needs setuptools, which
# a Debian python3-torch or a Python 3.12+ venv need not have.
root = os.path.dirname(os.path.abspath(torch.__file__))
includes = [os.path.join(root, "include"),
            os.path.join(root, "include", "torch", "csrc", "api", "include")]
includes += [d for d in (os.path.join(root, "include", "TH"), os.path.join(root, "include", "THC"))
             if os.path.isdir(d)]
print("includes=" + "|".join(includes))
print("libdir=" + os.path.join(root, "lib"))
print("python_include=" + sysconfig.get_paths()["include"])
print("ext_suffix=" + sysconfig.get_config_var("EXT_SUFFIX"))
# Debian's python has a posix_local scheme: where `make install` into /usr/local puts modules.
if "posix_local" in sysconfig.get_scheme_names():
    print("purelib_local=" + sysconfig.get_path("purelib", "posix_local"))
else:
    print("purelib_local=" + sysconfig.get_path("purelib"))
print("defines=" + "|".join(defines))
