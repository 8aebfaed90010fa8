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

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
