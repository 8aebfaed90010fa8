#!/usr/bin/env bash
# Runs the measurements of docs/PERFORMANCE.md: every workload at 2 ranks (one per core)
# and 4 ranks (oversubscribed) under mpirun, and under tuttirun --gloo when the build has
# it, REPEATS times each; writes one JSON per run into OUT_DIR, then the Markdown tables of
# medians (tables.md) and the plot (allreduce_busbw.png).
#
#   bench/run_suite.sh [BUILD_DIR=build] [OUT_DIR=bench-results] [REPEATS=3]
#   RANKS="2" WORKLOADS="allreduce latency" bench/run_suite.sh    # a subset
set -euo pipefail

BUILD=${1:-build}
OUT=${2:-bench-results}
REPEATS=${3:-3}
RANKS=${RANKS:-"2 4"}
WORKLOADS=${WORKLOADS:-"allreduce allgather broadcast alltoall reducescatter fusion latency"}
BACKENDS=${BACKENDS:-"mpi gloo"}
BENCH="$BUILD/bench/tutti-bench"
TUTTIRUN="$BUILD/launcher/tuttirun"
PLOT="$(dirname "$0")/../scripts/plot_bench.py"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TUTTI_TIMEOUT_SECONDS=${TUTTI_TIMEOUT_SECONDS:-120}
mkdir -p "$OUT"

flags_for() {
  case "$1" in
    allreduce) echo "-b 4 -e 64M -f 4 -n 20 -w 5" ;;
    allgather|alltoall|reducescatter|broadcast) echo "-b 1K -e 64M -f 8 -n 20 -w 5" ;;
    fusion) echo "-n 20 -w 5" ;;
    latency) echo "-n 2000 -w 50" ;;
  esac
}

launch() {  # backend ranks -> the launcher command line
  if [ "$1" = mpi ]; then
    echo "mpirun -np $2 --oversubscribe --bind-to none --mca btl self,vader"
  else
    echo "$TUTTIRUN -np $2 --gloo"
  fi
}

for backend in $BACKENDS; do
  if [ "$backend" = gloo ] && [ ! -x "$TUTTIRUN" ]; then
    echo "# skipping gloo: no $TUTTIRUN" >&2
    continue
  fi
  for np in $RANKS; do
    for w in $WORKLOADS; do
      for r in $(seq 1 "$REPEATS"); do
        json="$OUT/${w}_${backend}_np${np}_r${r}.json"
        echo "# $(launch "$backend" "$np") $BENCH $w $(flags_for "$w") --baseline --json $json"
        # shellcheck disable=SC2046
        $(launch "$backend" "$np") "$BENCH" "$w" $(flags_for "$w") --baseline --json "$json"
      done
    done
  done
done

/usr/bin/python3 "$PLOT" --table "$OUT"/*.json > "$OUT/tables.md"
/usr/bin/python3 "$PLOT" -o "$OUT/allreduce_busbw.png" "$OUT"/allreduce_*.json
echo "# wrote $OUT/tables.md and $OUT/allreduce_busbw.png"
