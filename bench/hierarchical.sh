#!/usr/bin/env bash
# Hierarchical against flat collectives across hosts (docs/PERFORMANCE.md, "Hierarchical
# allreduce" and "Hierarchical allgather"): two simulated hosts (test/multihost/hosts.sh:
# network namespaces, needs root) with 2 ranks each, each host's link limited to RATE with
# tc tbf; for each op of OPS, tutti-bench OP under tuttirun with TUTTI_HIERARCHICAL_<OP>=1
# and =0, REPEATS runs of each, interleaved; prints per op the medians of the out-of-place
# times per size (allgather: the size gathered) and their ratio.
#
#   bench/hierarchical.sh [BUILD_DIR=build] [OUT_DIR=bench-results/hierarchical] [REPEATS=3]
#   RATE=off LAUNCH="--mpi" FLAGS="-b 64K -e 4M -f 4 -n 5 -w 2" OPS=allgather \
#     bench/hierarchical.sh
#
# The hosts are shared with the multi-host tests: this holds /tmp/tutti-multihost.lock while
# they are up, and takes them down on exit.
set -euo pipefail

BUILD=${1:-build}
OUT=${2:-bench-results/hierarchical}
REPEATS=${3:-3}
RATE=${RATE:-1gbit}
LAUNCH=${LAUNCH:---gloo}
FLAGS=${FLAGS:-"-b 16M -e 64M -f 2 -n 3 -w 1"}
OPS=${OPS:-"allreduce allgather"}
HERE=$(cd "$(dirname "$0")" && pwd)
HOSTS="$HERE/../test/multihost/hosts.sh"
BENCH=$(realpath "$BUILD/bench/tutti-bench")
TUTTIRUN=$(realpath "$BUILD/launcher/tuttirun")

if [ -z "${TUTTI_HIER_BENCH_LOCKED:-}" ]; then
  export TUTTI_HIER_BENCH_LOCKED=1
  exec flock -w 600 /tmp/tutti-multihost.lock "$0" "$@"
fi
mkdir -p "$OUT"
trap 'bash "$HOSTS" down >/dev/null 2>&1 || true' EXIT
bash "$HOSTS" up 2
eval "$(bash "$HOSTS" env)"
for h in tutti-h1 tutti-h2; do bash "$HOSTS" limit "$h" "$RATE"; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TUTTI_TIMEOUT_SECONDS=${TUTTI_TIMEOUT_SECONDS:-300}

for op in $OPS; do
  var=TUTTI_HIERARCHICAL_${op^^}
  rm -f "$OUT/${op}_hier"*_r*.json
  for r in $(seq 1 "$REPEATS"); do
    for hier in 1 0; do
      json="$OUT/${op}_hier${hier}_r${r}.json"
      echo "# $var=$hier tuttirun -np 4 $LAUNCH -H tutti-h1:2,tutti-h2:2 tutti-bench $op $FLAGS"
      # shellcheck disable=SC2086
      env "$var=$hier" "$TUTTIRUN" -np 4 $LAUNCH -H tutti-h1:2,tutti-h2:2 \
        "$BENCH" "$op" $FLAGS --json "$json" > "$OUT/${op}_hier${hier}_r${r}.txt"
    done
  done
done

/usr/bin/python3 - "$OUT" "$RATE" "$LAUNCH" $OPS <<'PY'
import glob, json, statistics, sys
out, rate, launch, ops = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
for op in ops:
    times = {}
    for hier in ("1", "0"):
        for path in glob.glob("%s/%s_hier%s_r*.json" % (out, op, hier)):
            with open(path) as f:
                for row in json.load(f)["rows"]:
                    times.setdefault((row["size"], hier), []).append(
                        row["out_of_place"]["time_us"])
    print("\n%s: links %s, tuttirun %s, 2 hosts x 2 ranks, float32, medians of %d runs" %
          (op, rate, launch, len(times[next(iter(times))])))
    print("| size | hierarchical (ms) | flat (ms) | flat / hierarchical |")
    print("|---|---|---|---|")
    for size in sorted({s for s, _ in times}):
        h, f = (statistics.median(times[(size, m)]) / 1000 for m in ("1", "0"))
        label = "%d MiB" % (size >> 20) if size >= 1 << 20 else "%d KiB" % (size >> 10)
        print("| %s | %.1f | %.1f | %.2fx |" % (label, h, f, f / h))
PY
