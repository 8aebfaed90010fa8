#!/usr/bin/env bash
# The pip way, end to end, in a fresh venv made with PYTHON (default: the first python3 on PATH):
#   1. an sdist of the tree (scikit-build-core), as `python -m build --sdist` would make it,
#      unpacked once: the installs below build that directory;
#   2. TUTTI_WITH_TORCH=1 with no torch in the venv fails, and says torch cannot be imported;
#   3. with no torch: pip install succeeds with libtutti, the tools and the tutti package, and
#      `import tutti.torch` says torch was missing at build time and how to rebuild;
#   4. pip install torch==TORCH_VERSION (no numpy), then the same directory again the way that
#      message says (--force-reinstall --no-deps --no-cache-dir). Both installs use one
#      scikit-build-core build dir (--config-settings=build-dir=...: the pip of Python 3.11's
#      venv, 23.0, has no -C), so the second reuses the first's build tree instead of building
#      from scratch (it still recompiled 52 of the first's 68 C++ files when measured; each
#      install prints its count);
#   5. with only the venv's bin/ and /usr/bin on PATH (no LD_LIBRARY_PATH, no PYTHONPATH):
#      tutti-info, tutti-bench --help, tuttirun --check-build, and `tuttirun -np 2 python
#      train.py`, a 2-rank job through tutti.torch that trains with broadcast_optimizer_state.
# Usage: pip_install_test.sh SOURCE_DIR. Everything lives in one temporary directory that is
# removed on exit, with any process this script started.
set -euo pipefail
src=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
work=$(mktemp -d /tmp/tutti-pip-test.XXXXXX)
cleanup() {
  local rc=$?
  pkill -TERM -P $$ 2>/dev/null || true  # this script's own children, if a step was cut short
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
step() { echo "== $(date +%T) $*"; }
# Every step has a deadline: the whole test must end within CTest's.
pip() { timeout 900 "$work/venv/bin/python" -m pip --disable-pip-version-check "$@"; }

step "venv with $PYTHON ($("$PYTHON" --version 2>&1))"
"$PYTHON" -m venv "$work/venv"
pip install -q scikit-build-core
step "sdist"
(cd "$src" && "$work/venv/bin/python" -c 'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' "$work/dist") > "$work/sdist.log" 2>&1 ||
  { cat "$work/sdist.log"; exit 1; }
sdist=$(ls "$work"/dist/tutti-*.tar.gz)
echo "$sdist: $(tar tzf "$sdist" | wc -l) files"
if tar tzf "$sdist" | grep -E '/(build|\.venv-torch)/' | head -3 | grep .; then
  echo "FAIL: the sdist carries build trees or venvs"; exit 1
fi

tar xzf "$sdist" -C "$work"
tree=$(ls -d "$work"/tutti-*/)
build="$work/skbuild"
# The second install rebuilds most of the first's objects (scikit-build-core regenerates the
# tree): a ccache private to this test, where installed, serves them from the first build.
if command -v ccache > /dev/null; then
  export CMAKE_ARGS="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  export CCACHE_DIR="$work/ccache" CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=1
fi

step "TUTTI_WITH_TORCH=1 without torch must fail and name torch"
if TUTTI_WITH_TORCH=1 pip install --no-cache-dir "$tree" > "$work/notorch.log" 2>&1; then
  echo "FAIL: installed with TUTTI_WITH_TORCH=1 and no torch"; exit 1
fi
# CMake wraps the message: compare it with the line breaks and indentation folded.
tr -s ' \n' '  ' < "$work/notorch.log" > "$work/notorch.txt"
grep -o "TUTTI_WITH_TORCH=1 asks for the PyTorch adapter.*cannot import torch ([^)]*)" \
  "$work/notorch.txt" || { tail -40 "$work/notorch.log"; echo "FAIL: no message naming torch"; exit 1; }

run() { env -i HOME="$work" PATH="$work/venv/bin:/usr/bin:/bin" TUTTI_TIMEOUT_SECONDS=60 "$@"; }
tools() {
  for tool in tuttirun tutti-timeline tutti-bench tutti-bench-plot tutti-info; do
    [ -x "$work/venv/bin/$tool" ] || { echo "FAIL: $tool is not in the venv's bin/ ($1)"; exit 1; }
  done
}

step "no torch: pip install builds the core, the tools and the tutti package"
pip install -v --no-cache-dir --config-settings=build-dir="$build" "$tree" \
  > "$work/install-notorch.log" 2>&1 ||
  { tail -60 "$work/install-notorch.log"; echo "FAIL: pip install without torch"; exit 1; }
echo "compiled $(grep -c 'Building CXX object' "$work/install-notorch.log") C++ files"
tools "installed without torch"
run tuttirun --check-build
run python -c 'import tutti; print("tutti", tutti.__version__, "from", tutti.__file__)'
if run python -c 'import tutti.torch' > "$work/import.log" 2>&1; then
  echo "FAIL: import tutti.torch worked in an install built without torch"; exit 1
fi
message=$(tail -1 "$work/import.log")
echo "$message"
for expect in "ImportError: tutti.torch is not available: this Tutti was built without torch" \
              "cannot import torch (ModuleNotFoundError" \
              "$work/venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir"; do
  case "$message" in
    *"$expect"*) ;;
    *) cat "$work/import.log"; echo "FAIL: import tutti.torch does not say: $expect"; exit 1 ;;
  esac
done

step "pip install torch==$TORCH_VERSION, then the same tree again into the same build dir"
pip install -q "torch==$TORCH_VERSION" 2>&1 | grep -v '^WARNING: Location' || true
if run python -c 'import numpy' 2> /dev/null; then
  echo "FAIL: the venv has numpy: the test must show that tutti.torch works without it"; exit 1
fi
pip install -v --force-reinstall --no-deps --no-cache-dir \
  --config-settings=build-dir="$build" "$tree" \
  > "$work/install.log" 2>&1 ||
  { tail -60 "$work/install.log"; echo "FAIL: pip install with torch"; exit 1; }
grep -E "Tutti (backends|: torch)" "$work/install.log" || true
echo "compiled $(grep -c 'Building CXX object' "$work/install.log") C++ files"
if [ -n "${CCACHE_DIR:-}" ]; then ccache -s | grep -iE "hits|misses" | head -4 || true; fi

step "the installed tools, with nothing set but PATH"
tools "installed with torch"
run tutti-info
run tutti-bench --help > /dev/null
run tutti-bench-plot --help > /dev/null
run tuttirun --check-build
cd "$work"
run timeout 120 tuttirun -np 2 python "$here/train.py"
step "ok"
