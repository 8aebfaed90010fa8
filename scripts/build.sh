#!/usr/bin/env bash
# Configures, builds and installs Tutti (library, headers, CMake package, pkg-config file,
# tuttirun, tutti-bench, tutti-info and the tutti.torch Python package) into PREFIX
# (default /usr/local). BUILD_DIR defaults to ./build; CMAKE_ARGS adds configure options.
# Needs the dependencies of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
PREFIX=${PREFIX:-/usr/local}
JOBS=${JOBS:-$(nproc)}

# shellcheck disable=SC2086  # CMAKE_ARGS is a list of options
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
SUDO=""
if [ ! -w "$PREFIX" ] && [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO cmake --install "$BUILD_DIR" > "$BUILD_DIR/install.log"
if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then $SUDO ldconfig || true; fi
echo "build: installed into $PREFIX (log: $BUILD_DIR/install.log)"
