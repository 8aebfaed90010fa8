#!/usr/bin/env bash
# Sets up a fresh Debian 12 or 13 machine, builds and installs Tutti, and runs every test
# through CTest: Catch2 unit tests, multi-process tests under mpirun and tuttirun, launcher
# tests, the pytest suite of tutti.torch against Debian's torch and against the pip torch in
# .venv-torch, and the pip install test (sdist -> fresh venv -> 2-rank job). Every test has a
# deadline (CTest TIMEOUT).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Line tables only (TUTTI_DEBUG_INFO=lines): backtraces keep file:line, the build takes ~40% less.
CMAKE_ARGS="-DTUTTI_TEST_PACKAGING=ON -DTUTTI_DEBUG_INFO=lines ${CMAKE_ARGS:-}" bash scripts/build.sh
# Sanitizers: ASan+UBSan build of the unit, integration and fuzz tests, TSan build of the unit
# tests (docs/testing.md). TUTTI_SANITIZE=0 leaves the stage out. Their trees build while the
# regular suite runs, at the lowest priority: the compiler gets the CPU time the tests leave
# idle (waits on deadlines, peers and sshd) and almost none while a test computes.
sanitize=${TUTTI_SANITIZE:-1}
sanitize_build=""
stop_sanitize_build() {
  [ -z "$sanitize_build" ] || kill -- "-$sanitize_build" 2>/dev/null || true
  sanitize_build=""
}
if [ "$sanitize" != 0 ]; then
  SANITIZE_STEP=build setsid nice -n 19 bash scripts/sanitize.sh > build-sanitize.log 2>&1 &
  sanitize_build=$!
  trap stop_sanitize_build EXIT
  # setsid made it a session of its own, and under the kernel's autogroup scheduling a
  # session's weight is its autogroup's nice, not its processes': set that too. Where that
  # cannot be done the build would take half of the CPU from the tests: build afterwards.
  if [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo 0)" != 0 ] &&
     ! echo 19 2>/dev/null > "/proc/$sanitize_build/autogroup"; then
    stop_sanitize_build
  fi
fi
rc=0
(
  cd "${BUILD_DIR:-build}"
  # Multi-rank tests declare PROCESSORS; -j2 runs single-rank tests side by side only.
  # tuttirun binds ranks to cores by default (--bind-to auto); tests run jobs side by side
  # (and beside the sanitizer build), where every job's rank 0 would share core 0: they run
  # unbound, as under mpirun (--bind-to none); test/launcher checks the binding itself.
  TUTTI_BIND_TO=none ctest --output-on-failure --timeout 600 -j "${CTEST_JOBS:-2}"
) || rc=$?
if [ "$sanitize" != 0 ]; then
  if [ "$rc" != 0 ]; then exit "$rc"; fi  # the trap stops the sanitizer build
  if [ -n "$sanitize_build" ]; then
    build_rc=0
    wait "$sanitize_build" || build_rc=$?
    sanitize_build=""
    cat build-sanitize.log
    [ "$build_rc" = 0 ] || exit "$build_rc"
  fi
  SANITIZE_STEP=test bash scripts/sanitize.sh  # builds the trees first if they are not built
fi
exit "$rc"
