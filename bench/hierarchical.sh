#!/usr/bin/env bash
# Hierarchical against flat allreduce across hosts (docs/PERFORMANCE.md, "Hierarchical
# allreduce"): two simulated hosts (test/multihost/hosts.sh: network namespaces, needs
# root) with 2 ranks each, each host's link limited to RATE with tc tbf; tutti-bench
# allreduce under tuttirun with TUTTI_HIERARCHICAL_ALLREDUCE=1 and =0, REPEATS runs of each,
# interleaved; prints the medians of the out-of-place times per size and their ratio.
#
#   bench/hierarchical.sh [BUILD_DIR=build] [OUT_DIR=bench-results/hierarchical] [REPEATS=3]
#   RATE=off LAUNCH="--mpi" FLAGS="-b 64K -e 4M -f 4 -n 5 -w 2" bench/hierarchical.sh
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

for r in $(seq 1 "$REPEATS"); do
  for hier in 1 0; do
    json="$OUT/allreduce_hier${hier}_r${r}.json"
    echo "# TUTTI_HIERARCHICAL_ALLREDUCE=$hier tuttirun -np 4 $LAUNCH" \
      "-H tutti-h1:2,tutti-h2:2 tutti-bench allreduce $FLAGS"
    # shellcheck disable=SC2086
    TUTTI_HIERARCHICAL_ALLREDUCE=$hier "$TUTTIRUN" -np 4 $LAUNCH -H tutti-h1:2,tutti-h2:2 \
      "$BENCH" allreduce $FLAGS --json "$json" > "$OUT/allreduce_hier${hier}_r${r}.txt"
  done
done

/usr/bin/python3 - "$OUT" "$RATE" "$LAUNCH" <<'PY'
import glob, json, statistics, sys
out, rate, launch = sys.argv[1:]
times = {}
for hier in ("1", "0"):
    for path in glob.glob("%s/allreduce_hier%s_r*.json" % (out, hier)):
        with open(path) as f:
            for row in json.load(f)["rows"]:
                times.setdefault((row["size"], hier), []).append(row["out_of_place"]["time_us"])
print("links %s, tuttirun %s, 2 hosts x 2 ranks, float32 sum, medians of %d runs" %
      (rate, launch, len(times[next(iter(times))])))
print("| size | hierarchical (ms) | flat (ms) | flat / hierarchical |")
print("|---|---|---|---|")
for size in sorted({s for s, _ in times}):
    h, f = (statistics.median(times[(size, m)]) / 1000 for m in ("1", "0"))
    label = "%d MiB" % (size >> 20) if size >= 1 << 20 else "%d KiB" % (size >> 10)
    print("| %s | %.1f | %.1f | %.2fx |" % (label, h, f, f / h))
PY
