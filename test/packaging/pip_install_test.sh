#!/usr/bin/env bash
# The pip way, end to end, in a fresh venv made with PYTHON (default: the first python3 on PATH):
#   1. an sdist of the tree (scikit-build-core), as `python -m build --sdist` would make it;
#   2. TUTTI_WITH_TORCH=1 with no torch in the venv fails, and says torch cannot be imported;
#   3. pip install torch==TORCH_VERSION, then pip install the sdist (build isolation on);
#   4. with only the venv's bin/ and /usr/bin on PATH (no LD_LIBRARY_PATH, no PYTHONPATH):
#      tutti-info, tutti-bench --help, tuttirun --check-build, and `tuttirun -np 2 python
#      train.py`, a 2-rank allreduce/allgather through tutti.torch.
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

step "TUTTI_WITH_TORCH=1 without torch must fail and name torch"
if TUTTI_WITH_TORCH=1 pip install --no-cache-dir "$sdist" > "$work/notorch.log" 2>&1; then
  echo "FAIL: installed with TUTTI_WITH_TORCH=1 and no torch"; exit 1
fi
# CMake wraps the message: compare it with the line breaks and indentation folded.
tr -s ' \n' '  ' < "$work/notorch.log" > "$work/notorch.txt"
grep -o "TUTTI_WITH_TORCH=1 asks for the PyTorch adapter.*cannot import torch ([^)]*)" \
  "$work/notorch.txt" || { tail -40 "$work/notorch.log"; echo "FAIL: no message naming torch"; exit 1; }

step "pip install torch==$TORCH_VERSION, then the sdist"
pip install -q "torch==$TORCH_VERSION" 2>&1 | grep -v '^WARNING: Location' || true
pip install --no-cache-dir "$sdist" > "$work/install.log" 2>&1 ||
  { tail -60 "$work/install.log"; echo "FAIL: pip install of the sdist"; exit 1; }
grep -E "Tutti (backends|: torch)" "$work/install.log" || true

step "the installed tools, with nothing set but PATH"
run() { env -i HOME="$work" PATH="$work/venv/bin:/usr/bin:/bin" TUTTI_TIMEOUT_SECONDS=60 "$@"; }
for tool in tuttirun tutti-timeline tutti-bench tutti-bench-plot tutti-info; do
  [ -x "$work/venv/bin/$tool" ] || { echo "FAIL: $tool is not in the venv's bin/"; exit 1; }
done
run tutti-info
run tutti-bench --help > /dev/null
run tutti-bench-plot --help > /dev/null
run tuttirun --check-build
cd "$work"
run timeout 120 tuttirun -np 2 python "$here/train.py"
step "ok"
