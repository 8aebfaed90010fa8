#!/usr/bin/env bash
# Pipelined against sequential rounds (docs/PERFORMANCE.md, "Pipelined rounds"): for each
# launcher of LAUNCHERS and each rank count of RANKS, the fusion step (256 x 4 KiB and
# 64 x 256 KiB), the lone 4-byte allreduce and the training throughput
# (bench/torch_throughput.py, when PYTHON has torch) with TUTTI_PIPELINE=1 and =0, REPEATS
# runs of each, interleaved (1, 0, 1, 0, ...) so that a change of load hits both; prints the
# medians and the pipelined rounds' gain (> 1: faster).
#
#   bench/pipeline.sh [BUILD_DIR=build] [OUT_DIR=bench-results/pipeline] [REPEATS=3]
#   RANKS="2" LAUNCHERS="mpirun" PYTHON=.venv-torch/bin/python \
#     PYTHONPATH=build/python-torch2 bench/pipeline.sh        # with the training run
set -euo pipefail

BUILD=${1:-build}
OUT=${2:-bench-results/pipeline}
REPEATS=${3:-3}
RANKS=${RANKS:-"2 4"}
LAUNCHERS=${LAUNCHERS:-"mpirun tuttirun"}
PYTHON=${PYTHON:-}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$(realpath "$BUILD/bench/tutti-bench")
TUTTIRUN=$(realpath "$BUILD/launcher/tuttirun")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TUTTI_TIMEOUT_SECONDS=${TUTTI_TIMEOUT_SECONDS:-120}
mkdir -p "$OUT"
rm -f "$OUT"/*.json

launch() {  # launcher ranks pipeline -> the command line prefix
  case "$1" in
    mpirun) echo "mpirun -np $2 --oversubscribe --bind-to none --mca btl self,vader -x TUTTI_PIPELINE=$3 -x PYTHONPATH" ;;
    tuttirun) echo "env TUTTI_PIPELINE=$3 $TUTTIRUN -np $2 --gloo" ;;
  esac
}

for launcher in $LAUNCHERS; do
  for np in $RANKS; do
    for r in $(seq 1 "$REPEATS"); do
      for p in 1 0; do
        tag="${launcher}_np${np}_p${p}_r${r}"
        echo "# TUTTI_PIPELINE=$p $launcher -np $np (run $r)"
        # shellcheck disable=SC2046
        $(launch "$launcher" "$np" "$p") "$BENCH" fusion -n 20 -w 5 --json "$OUT/fusion_$tag.json" > /dev/null
        # shellcheck disable=SC2046
        $(launch "$launcher" "$np" "$p") "$BENCH" latency -n 2000 -w 50 --json "$OUT/latency_$tag.json" > /dev/null
        if [ -n "$PYTHON" ]; then
          # shellcheck disable=SC2046
          $(launch "$launcher" "$np" "$p") "$PYTHON" "$HERE/torch_throughput.py" \
            --num-iters 3 --json "$OUT/train_$tag.json" > /dev/null
        fi
      done
    done
  done
done

python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
vals = {}
for path in glob.glob(os.path.join(out, "*.json")):
    kind, launcher, np, p, _ = re.match(r"(\w+?)_(\w+)_np(\d)_p(\d)_r(\d+)", os.path.basename(path)).groups()
    with open(path) as f:
        d = json.load(f)
    key = (launcher, int(np))
    if kind == "fusion":
        for row in d["fusion"]:
            what = "step %d x %d KiB (us)" % (row["tensors"], row["tensor_bytes"] >> 10)
            vals.setdefault(key + (what, p), []).append(row["tutti_step_us"])
    elif kind == "latency":
        vals.setdefault(key + ("lone 4 B allreduce median (us)", p), []).append(d["latency"][0]["tutti"]["median_us"])
    else:
        total = {(r["model"], r["framework"]): r for r in d["results"]}
        for (model, framework), row in total.items():
            if framework != "tutti":
                continue
            what = "%s batch %d: samples/s" % (model, row["batch_per_rank"])
            vals.setdefault(key + (what, p), []).append(row["samples_per_sec_total"])
            ddp = total.get((model, "ddp"))
            if ddp:  # measured in the same run: the ratio is robust to load
                vals.setdefault(key + ("%s batch %d: Tutti / DDP" % (model, row["batch_per_rank"]), p),
                                []).append(row["samples_per_sec_total"] / ddp["samples_per_sec_total"])
print("| launcher | ranks | measure | pipelined | sequential | pipelined's gain |")
print("|---|---|---|---|---|---|")
for key in sorted({k[:3] for k in vals}):
    on, off = (statistics.median(vals.get(key + (p,), [float("nan")])) for p in ("1", "0"))
    gain = off / on if "(us)" in key[2] else on / off  # > 1: pipelined is better
    print("| %s | %d | %s | %.3g | %.3g | %.2fx |" % (key[0], key[1], key[2], on, off, gain))
PY
