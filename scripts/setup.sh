#!/usr/bin/env bash
# Installs every build and test dependency of Tutti from Debian 12 packages.
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libgloo-dev
  catch2
  pybind11-dev python3-pybind11
  python3-torch libtorch-dev
  python3-pytest python3-numpy python3-matplotlib
  libssl-dev
  openssh-client procps
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
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
