#!/usr/bin/env bash
# The sanitizer stage (docs/testing.md), self-contained:
#   1. build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer; runs the unit tests, the
#      multi-process integration tests (mpirun and tuttirun --gloo) and the C API fuzz test;
#   2. build-tsan/: ThreadSanitizer; runs the unit tests (threads as ranks over loopback; the
#      execution stream's own tests, test/unit/exec_stream_test.cc, among them: its thread
#      against the background thread, pipelined rounds forced on) and the shm and
#      hierarchical backends' threads-as-ranks tests.
# No torch extension, no NCCL, no bench: only the targets those tests need. Exits non-zero
# when a test fails or any sanitizer report appears in any process's output.
# Environment: SANITIZE_JOBS (build and ctest parallelism, default 2), SANITIZE_ONLY=asan|tsan,
# SANITIZE_STEP=build|test (default both: build, then test; scripts/test.sh builds while the
# regular suite runs, then tests).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${SANITIZE_JOBS:-2}
only=${SANITIZE_ONLY:-}
step=${SANITIZE_STEP:-}
start=$(date +%s)

configure() {  # dir sanitizer
  mkdir -p "$1"
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTUTTI_SANITIZE="$2" \
    -DTUTTI_WITH_TORCH=OFF -DTUTTI_WITH_NCCL=OFF >"$1/configure.log" 2>&1 ||
    { cat "$1/configure.log"; exit 1; }
}

# Runs ctest with a log of every test's output, then fails on a test failure or on any
# sanitizer report (a report in a rank that mpirun or tuttirun swallowed counts too).
run_tests() {  # dir regex [log-suffix]
  local log="$root/$1/sanitize-ctest${3:+-$3}.log" rc=0
  (cd "$1" && ctest -R "$2" -E 'example' --timeout 300 -j "$jobs" --output-on-failure \
     --output-log "$log") || rc=$?
  if grep -nE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer' "$log" |
     head -20; then
    echo "sanitize.sh: sanitizer reports in $log" >&2
    rc=1
  fi
  return $rc
}

# halt/abort on the first report, never recover: the test fails where the report is.
export ASAN_OPTIONS="abort_on_error=1:detect_stack_use_after_return=1:strict_init_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/test/sanitizers/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/test/sanitizers/tsan.supp"
# Open MPI as root in CI containers; oversubscribed ranks on a small machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0

build() {  # dir target...
  local dir=$1
  shift
  nice -n 10 cmake --build "$dir" -j "$jobs" --target "$@" >"$dir/build.log" 2>&1 ||
    { tail -50 "$dir/build.log"; exit 1; }
}

integ=$(cd test/integration && sed -n 's/^set(_integ_binaries \(.*\))/\1/p' CMakeLists.txt)
# integ_waiters: two threads waiting on one handle (a double free before it was fixed);
# integ_group_size: a grouped allreduce of another size on one rank (its _np2 tests match below).
asan_targets="tutti tuttirun tutti_unit_test tutti_c_api_fuzz integ_failure integ_shm integ_waiters integ_c_entries integ_group_size tutti_slurm_unit"
for b in $integ; do asan_targets="$asan_targets integ_$b"; done
tsan_targets="tutti tutti_unit_test tutti_shm_test tutti_hier_test tutti_conformance_test"
# The test step alone still brings the trees up to date (a no-op after the build step).
if [[ -z "$only" || "$only" == asan ]]; then
  echo "== sanitize: ASan + UBSan build (build-asan/)"
  [[ "$step" == test && -f build-asan/CMakeCache.txt ]] || configure build-asan address
  # shellcheck disable=SC2086  # a list of targets
  build build-asan $asan_targets
fi
if [[ -z "$only" || "$only" == tsan ]]; then
  echo "== sanitize: TSan build (build-tsan/) ($(( $(date +%s) - start )) s so far)"
  [[ "$step" == test && -f build-tsan/CMakeCache.txt ]] || configure build-tsan thread
  # shellcheck disable=SC2086
  build build-tsan $tsan_targets
fi
if [[ "$step" == build ]]; then
  echo "== sanitize: built in $(( $(date +%s) - start )) s"
  exit 0
fi

if [[ -z "$only" || "$only" == asan ]]; then
  echo "== sanitize: ASan + UBSan tests ($(( $(date +%s) - start )) s so far)"
  # Every integration binary at 2 ranks under each launcher (the 1-4 rank sweep is the
  # regular suite's; under ASan it would not fit the CI budget), the fuzz test at 1 and 3.
  # integ_waiters_{gloo,mpi}_np2 (two waiters on one handle) are among the integ_* matched here.
  # Open MPI's exit-time allocations are reported as leaks with stacks in unloaded plugins
  # that no suppression can name: leak checking is off for jobs under mpirun only.
  run_tests build-asan '^(unit|slurm_unit|fuzz_c_api_np1|fuzz_c_api_gloo_np3|integ_[a-z_]+_gloo_np2)$' || status=1
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" run_tests build-asan '^(fuzz_c_api_mpi_np3|integ_[a-z_]+_mpi_np2)$' mpi ||
    status=1
fi

if [[ -z "$only" || "$only" == tsan ]]; then
  echo "== sanitize: TSan tests ($(( $(date +%s) - start )) s so far)"
  # The conformance suite's thread backends at 1-3 members (hierarchical: its 2x2 shapes):
  # every op and dtype still runs, and an odd size; all sizes take minutes under TSan.
  TUTTI_CONFORMANCE_MAX_MEMBERS=3 \
    run_tests build-tsan '^(unit|shm\.ops|shm\.hierarchical|conformance\.(loopback|shm|hierarchical))$' || status=1
fi

echo "== sanitize: $([[ $status == 0 ]] && echo clean || echo FAILED) in $(( $(date +%s) - start )) s"
exit $status
