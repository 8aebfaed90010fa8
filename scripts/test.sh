#!/usr/bin/env bash
# Sets up a fresh Debian 12 or 13 machine, builds and installs Tutti, and runs every test
# through CTest: Catch2 unit tests, multi-process tests under mpirun and tuttirun, launcher
# tests, the pytest suite of tutti.torch against Debian's torch and against the pip torch in
# .venv-torch, and the pip install test (sdist -> fresh venv -> 2-rank job). Every test has a
# deadline (CTest TIMEOUT).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
CMAKE_ARGS="-DTUTTI_TEST_PACKAGING=ON ${CMAKE_ARGS:-}" bash scripts/build.sh
(
  cd "${BUILD_DIR:-build}"
  # Multi-rank tests declare PROCESSORS; -j2 runs single-rank tests side by side only.
  ctest --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}"
)
# Sanitizers: ASan+UBSan build of the unit, integration and fuzz tests, TSan build of the unit
# tests (docs/testing.md). TUTTI_SANITIZE=0 leaves the stage out.
if [ "${TUTTI_SANITIZE:-1}" != 0 ]; then
  bash scripts/sanitize.sh
fi
