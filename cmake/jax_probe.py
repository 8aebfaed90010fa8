"""Prints, one `key=value` line each, what CMake needs to build tutti.jax's XLA FFI library
against the jax this interpreter imports: its version and jaxlib's FFI headers
(jax.ffi.include_dir(), header only). Exits 1 with the import error on stderr when jax cannot
be imported or has no jax.ffi. Run by cmake/TuttiJax.cmake; standard library + jax only."""
import os
import sys

try:
    import jax
    import jax.ffi
    include = jax.ffi.include_dir()
except Exception as e:  # noqa: BLE001 - any failure means "no usable jax here"
    print("%s: %s" % (type(e).__name__, e), file=sys.stderr)
    sys.exit(1)
if not os.path.exists(os.path.join(include, "xla", "ffi", "api", "ffi.h")):
    print("jax %s: no xla/ffi/api/ffi.h under %s" % (jax.__version__, include), file=sys.stderr)
    sys.exit(1)
print("version=" + jax.__version__)
print("include=" + include)
