#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds and installs Tutti, and runs every test
# (Catch2 unit tests, multi-process tests under mpirun and tuttirun, launcher tests, pytest
# for tutti.torch) through CTest. Every test has a deadline (CTest TIMEOUT).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
# Multi-rank tests declare PROCESSORS; -j2 runs single-rank tests side by side only.
ctest --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}"
