#!/usr/bin/env bash
# Sets up a fresh Debian 12 or 13 machine, builds and installs Tutti, then runs the demo: a
# 4-rank data-parallel training job on this machine, started by tuttirun over gloo (no MPI
# needed) and then by mpirun, each rank averaging its gradients with Tutti.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
PREFIX=${PREFIX:-/usr/local}
DEMO_BUILD=${DEMO_BUILD:-build/demo}

echo "== what this build has"
"$PREFIX/bin/tuttirun" --check-build

echo "== the C++ trainer, built out of tree against the installed package"
cmake -S examples/cpp -B "$DEMO_BUILD" -DCMAKE_PREFIX_PATH="$PREFIX" > "$DEMO_BUILD.log" 2>&1 ||
  { cat "$DEMO_BUILD.log"; exit 1; }
cmake --build "$DEMO_BUILD" -j "$(nproc)" >> "$DEMO_BUILD.log" 2>&1 || { cat "$DEMO_BUILD.log"; exit 1; }

echo "== 4 ranks under tuttirun --gloo"
"$PREFIX/bin/tuttirun" -np 4 --gloo "$DEMO_BUILD/trainer"

echo "== 4 ranks under tuttirun --mpi (mpirun)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$PREFIX/bin/tuttirun" -np 4 --mpi "$DEMO_BUILD/trainer"

if /usr/bin/python3 -c "import tutti.torch" 2>/dev/null; then
  echo "== PyTorch: 2 ranks, import tutti.torch as hvd"
  "$PREFIX/bin/tuttirun" -np 2 --gloo /usr/bin/python3 examples/torch_mnist_synthetic.py
else
  echo "== PyTorch example skipped: /usr/bin/python3 cannot import tutti.torch" \
       "(no python3-torch, or PREFIX=$PREFIX is not on its path; docs/install.md)"
fi
