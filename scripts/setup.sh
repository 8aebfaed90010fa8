#!/usr/bin/env bash
# Installs every build and test dependency of Tutti on Debian 12 (bookworm) or 13 (trixie),
# then creates the torch 2.x test venv. Idempotent: what is already there is left alone.
# Needs root (or sudo) for apt-get.
#
# Debian packages (both releases have these names; the versions differ: Open MPI 4 / 5,
# Catch2 2 / 3, gloo snapshots, torch 1.13 / 2.6 for Debian's python3 — CMake adapts).
# Slurm (slurmctld, slurmd, slurm-client, munge) is for test/slurm, which starts its own
# one-node Slurm; installing it starts no daemon where policy-rc.d forbids it (containers),
# and test/slurm/slurm.sh uses its own key, config and ports either way. Open MPI reaches
# Slurm's PMIx plugin (srun --mpi=pmix) through Debian's libpmix, a dependency of both.
# MPICH (mpich) is only for its launcher, mpiexec.hydra, under which test/integration's
# launcher test runs a job: its alternatives have priority 40 against Open MPI's 50, so
# mpirun, mpiexec, mpicc and libmpi.so stay Open MPI's.
# ccache serves test/packaging's second pip build of the same tree from its first.
# Optional packages missing from the release (e.g. python3-torch) are skipped with a notice;
# the tests that need them are then not registered.
#
# The venv (TORCH_VENV, default .venv-torch in the repository, ignored by git) is made with the
# first python3 on PATH and holds torch==$TORCH_VERSION from pip plus pytest and numpy; the
# build compiles tutti.torch for it too and CTest runs the Python suite against both torches.
# SKIP_TORCH_VENV=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUIRED=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libgloo-dev
  catch2
  pybind11-dev python3-pybind11
  python3-pytest python3-numpy
  python3-venv
  libssl-dev
  openssh-client openssh-server iproute2 procps
  slurmctld slurmd slurm-client munge
  mpich
  ccache
)
# highwayhash and farmhash: headers that the TensorFlow wheel's XLA headers include but do not
# ship; with them tutti.tensorflow lowers its collectives into XLA (docs/tensorflow.md, "XLA").
OPTIONAL=(python3-torch libtorch-dev python3-matplotlib libhighwayhash-dev libfarmhash-dev)
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_VENV=${TORCH_VENV:-.venv-torch}

release=$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo unknown)
case "$release" in
  12|13) ;;
  *) echo "setup: /etc/debian_version says '$release'; this script knows Debian 12 and 13," \
          "trying the same package names" ;;
esac

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

missing=()
for p in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do installed "$p" || missing+=("$p"); done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all Debian packages already installed (Debian $release)"
else
  $SUDO apt-get update -q
  to_install=()
  for p in "${missing[@]}"; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      to_install+=("$p")
    elif [[ " ${OPTIONAL[*]} " == *" $p "* ]]; then
      echo "setup: notice: Debian $release has no package $p; skipping it (the tests that" \
           "need it are skipped)"
    else
      echo "setup: error: Debian $release has no package $p, which the build needs" >&2
      exit 1
    fi
  done
  if [ "${#to_install[@]}" -gt 0 ]; then
    echo "setup: installing ${to_install[*]}"
    $SUDO apt-get install -y -q --no-install-recommends "${to_install[@]}"
  fi
fi

if ! ls /usr/lib/*/slurm-wlm/mpi_pmix*.so >/dev/null 2>&1; then
  echo "setup: notice: this Slurm has no PMIx plugin (srun --mpi=list); the MPI-under-srun" \
       "tests are skipped"
fi

# NCCL: the backend is built wherever CUDA's nvcc is installed. Where NCCL is not beside CUDA,
# PyPI's nvidia-nccl-cu<major> wheel carries its headers and library; it is unpacked into
# /opt/tutti-deps/nccl, where CMakeLists.txt looks (TUTTI_NCCL_ROOT).
NCCL_DIR=${TUTTI_NCCL_DIR:-/opt/tutti-deps/nccl}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ -x "$CUDA_HOME/bin/nvcc" ] && [ ! -e "$CUDA_HOME/include/nccl.h" ] \
   && [ ! -e /usr/include/nccl.h ] && [ ! -e "$NCCL_DIR/nvidia/nccl/include/nccl.h" ]; then
  cuda_major=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if [ -n "$cuda_major" ]; then
    echo "setup: NCCL for CUDA $cuda_major from PyPI (nvidia-nccl-cu$cuda_major) into $NCCL_DIR"
    $SUDO mkdir -p "$NCCL_DIR"
    $SUDO python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
      --target "$NCCL_DIR" "nvidia-nccl-cu$cuda_major" \
      || echo "setup: NCCL could not be installed; the NCCL backend will not be built"
  fi
fi

# ---- the torch 2.x venv for the second Python leg of the tests ----
if [ "${SKIP_TORCH_VENV:-0}" = 1 ]; then
  echo "setup: SKIP_TORCH_VENV=1: no torch $TORCH_VERSION venv"
  exit 0
fi
# expecttest: torch's own test-suite needs it (test/python/pytorch_distributed_suite.py).
check='import sys, torch, pytest, numpy, mpi4py, expecttest; sys.exit(torch.__version__.split("+")[0] != sys.argv[1])'
if [ -x "$TORCH_VENV/bin/python" ] && "$TORCH_VENV/bin/python" -c "$check" "$TORCH_VERSION" 2>/dev/null; then
  echo "setup: $TORCH_VENV already has torch $TORCH_VERSION"
else
  py=$(command -v python3)
  echo "setup: creating $TORCH_VENV with $py ($("$py" --version 2>&1)) and torch==$TORCH_VERSION"
  "$py" -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==$TORCH_VERSION" pytest numpy mpi4py expecttest==0.3.0
  "$TORCH_VENV/bin/python" -c "$check" "$TORCH_VERSION"
fi

# pip check of the venv, tolerating exactly one complaint: tf-keras (installed --no-deps)
# requires `tensorflow`, whose modules tensorflow-cpu provides. Anything else fails.
pip_check() {
  local out rc=0
  out=$("$TORCH_VENV/bin/python" -m pip check 2>&1) || rc=$?
  [ "$rc" -eq 0 ] && return 0
  local rest
  rest=$(printf '%s\n' "$out" | grep -Ev '^tf-keras [^ ]+ requires tensorflow, which is not installed\.$' || true)
  if [ -n "$rest" ]; then
    printf '%s\n' "$out" >&2
    echo "setup: error: pip check of $TORCH_VENV failed (above)" >&2
    return 1
  fi
}

# ---- TensorFlow (tutti.tensorflow, tutti.keras) in the same venv ----
# tensorflow-cpu (a 274 MB wheel, about 1.3 GB installed) with the Keras 3 it depends on.
# SKIP_TF=1 leaves it out; the TensorFlow tests are then not registered.
TF_VERSION=${TF_VERSION:-2.21.0}
if [ "${SKIP_TF:-0}" = 1 ]; then
  echo "setup: SKIP_TF=1: no tensorflow-cpu $TF_VERSION in $TORCH_VENV"
else
  tf_check='import sys, importlib.metadata as m; sys.exit(m.version("tensorflow-cpu") != sys.argv[1])'
  if "$TORCH_VENV/bin/python" -c "$tf_check" "$TF_VERSION" 2>/dev/null; then
    echo "setup: $TORCH_VENV already has tensorflow $TF_VERSION"
  else
    echo "setup: installing tensorflow-cpu==$TF_VERSION into $TORCH_VENV"
    "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "tensorflow-cpu==$TF_VERSION"
    pip_check
    "$TORCH_VENV/bin/python" -c "import torch, tensorflow, keras; $tf_check" "$TF_VERSION"
  fi
  # Legacy Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) for tutti.keras on Keras 2 (docs/keras.md):
  # --no-deps, as its dependency `tensorflow` would pull the CUDA build next to tensorflow-cpu,
  # which provides the same modules.
  TF_KERAS_VERSION=${TF_KERAS_VERSION:-$TF_VERSION}
  tf_keras_check='import sys, importlib.metadata as m; sys.exit(m.version("tf-keras") != sys.argv[1])'
  if "$TORCH_VENV/bin/python" -c "$tf_keras_check" "$TF_KERAS_VERSION" 2>/dev/null; then
    echo "setup: $TORCH_VENV already has tf-keras $TF_KERAS_VERSION"
  else
    echo "setup: installing tf-keras==$TF_KERAS_VERSION (--no-deps) into $TORCH_VENV"
    "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      "tf-keras==$TF_KERAS_VERSION"
    pip_check
    # tf.keras (tf_keras.api._v2.keras) has no __version__: check that tf.keras is tf_keras.
    TF_USE_LEGACY_KERAS=1 "$TORCH_VENV/bin/python" -c \
      "import sys, tensorflow as tf, tf_keras; sys.exit(not (tf_keras.__version__.startswith('2.') and tf.keras.Model is tf_keras.Model))"
  fi
  # Horovod's Keras test files (the yardstick of docs/keras.md, not run in CI) import
  # parameterized: a 20 KB pure-Python wheel.
  if ! "$TORCH_VENV/bin/python" -c "import parameterized" 2>/dev/null; then
    "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check parameterized==0.9.0
  fi
fi

# ---- JAX (CPU wheels) in the same venv, for tutti.jax (docs/jax.md) ----
# jax/jaxlib 0.10.2 need numpy>=2.0, ml_dtypes>=0.5.0, scipy>=1.14: compatible with
# tensorflow-cpu 2.21.0's numpy>=1.26 and ml_dtypes>=0.5.1,<1.0, so both live in one venv.
# optax (small, pure Python) is for tutti.jax.DistributedOptimizer's tests. SKIP_JAX=1 leaves
# them out; the build then skips tutti.jax. Measured: 12 s to install from a warm pip cache,
# 2.5 s to check when present.
JAX_VERSION=${JAX_VERSION:-0.10.2}
OPTAX_VERSION=${OPTAX_VERSION:-0.2.8}
if [ "${SKIP_JAX:-0}" = 1 ]; then
  echo "setup: SKIP_JAX=1: no jax in $TORCH_VENV"
else
  jax_check='import sys, jax, jaxlib, optax
sys.exit(not (jax.__version__ == jaxlib.__version__ == sys.argv[1] and optax.__version__ == sys.argv[2]))'
  if "$TORCH_VENV/bin/python" -c "$jax_check" "$JAX_VERSION" "$OPTAX_VERSION" 2>/dev/null; then
    echo "setup: $TORCH_VENV already has jax $JAX_VERSION and optax $OPTAX_VERSION"
  else
    echo "setup: installing jax==$JAX_VERSION jaxlib==$JAX_VERSION (CPU) optax==$OPTAX_VERSION" \
         "into $TORCH_VENV"
    "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" "optax==$OPTAX_VERSION"
    pip_check  # next to torch and TensorFlow
    "$TORCH_VENV/bin/python" -c "$jax_check" "$JAX_VERSION" "$OPTAX_VERSION"
  fi
fi
