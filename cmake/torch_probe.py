"""Prints, one `key=value` line each (lists joined by "|"), what CMake needs to build the
tutti.torch extension against the torch this interpreter imports. Exits 1 with the import error on stderr when
torch cannot be imported. Run by cmake/TuttiTorch.cmake; standard library + torch only."""
import sys
import sysconfig

try:
    import torch
    from torch.utils import cpp_extension
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
print("includes=" + "|".join(cpp_extension.include_paths()))
print("libdir=" + cpp_extension.library_paths()[0])
print("python_include=" + sysconfig.get_paths()["include"])
print("ext_suffix=" + sysconfig.get_config_var("EXT_SUFFIX"))
# Debian's python has a posix_local scheme: where `make install` into /usr/local puts modules.
if "posix_local" in sysconfig.get_scheme_names():
    print("purelib_local=" + sysconfig.get_path("purelib", "posix_local"))
else:
    print("purelib_local=" + sysconfig.get_path("purelib"))
print("defines=" + "|".join(defines))
