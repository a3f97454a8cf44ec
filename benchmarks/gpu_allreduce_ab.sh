#!/usr/bin/env bash
# A/B of `aionet bench allreduce --device gpu` between this tree and another (BASE), on a lent
# GPU machine, interleaved in one run, plus host (numpy) rows of this tree for reference.
#
#   OUT=dir [MIN=1M MAX=64M ITERS=5 REPS=2] bash benchmarks/gpu_allreduce_ab.sh BASE_TREE [LABEL=TREE ...]
#
# BASE_TREE: a copy of another commit (e.g. `git archive <commit> aionet | tar -x -C base`);
# more trees to compare may follow as LABEL=PATH (labels of letters and digits).
# The caller sets PYTHONPATH for the dependencies (e.g. /tmp/site); each tree goes first on it.
# Writes one JSON line per size to $OUT/ar_<tree>_n<N>_<device>_<rep>.json and prints the
# out-of-place busbw (GB/s) per size with each run's median over REPS.
set -u
BASE=$1
shift
EXTRA=("$@")
REPS=${REPS:-2}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
DEPS=${PYTHONPATH:-}
run() {  # tree label n device rep
  PYTHONPATH="$1${DEPS:+:$DEPS}" timeout 120 python3 -m aionet bench allreduce --nodes "$3" --device "$4" \
    --min "${MIN:-1M}" --max "${MAX:-64M}" --factor 4 --iters "${ITERS:-5}" --warmup 2 --json > "$OUT/ar_$2_n$3_$4_$5.json" \
    || echo "run $2 n=$3 $4 rep $5 failed: $?"
}
for n in 2 4; do
  for rep in $(seq 1 "$REPS"); do
    echo "n=$n rep $rep ($(date +%T))"
    run "$BASE" base "$n" gpu "$rep"
    run "$PWD" new "$n" gpu "$rep"
    for t in "${EXTRA[@]}"; do run "${t#*=}" "${t%%=*}" "$n" gpu "$rep"; done
  done
  run "$PWD" new "$n" cpu 1
done
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "ar_*.json"))):
    _, tree, n, dev, _rep = os.path.basename(path)[:-5].split("_")
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault((int(n[1:]), r["size"], f"{tree} {dev}"), []).append((r["out"]["busbw"], r["out"]["wrong"]))
cols = ["base gpu", "new gpu"] + sorted({k[2] for k in rows} - {"base gpu", "new gpu", "new cpu"}) + ["new cpu"]
print("n  size       " + "".join(f"{c:>22}" for c in cols) + "   new/base gpu")
for n, size in sorted({(k[0], k[1]) for k in rows}):
    cells, med = [], {}
    for c in cols:
        v = rows.get((n, size, c), [])
        med[c] = statistics.median(b for b, _ in v) if v else None
        txt = "-" if not v else f"{med[c]:.3f} ({' '.join(f'{b:.2f}' for b, _ in v)}) w{sum(w for _, w in v)}"
        cells.append(f"{txt:>22}")
    ratio = med["new gpu"] / med["base gpu"] if med["new gpu"] and med["base gpu"] else float("nan")
    print(f"{n}  {size:>9}  " + "".join(cells) + f"   {ratio:.2f}x")
PY
