#!/bin/sh
# Pipeline bubble per schedule (bench_pipeline.cpp): P ranks of `atoll launch`, M micro-batches,
# one line per schedule with the measured bubble next to its ideal, and an SVG timeline of the
# median step per schedule in OUT. ZB-H1's idle time is also given as a share of 1F1B's.
#
# usage: bench/pipeline_bubble.sh [BUILD_DIR] [P] [M] [OUT]   (env: LAYERS EMBD B T STEPS THREADS V)
set -eu
BUILD=${1:-build}
P=${2:-2}
M=${3:-8}
OUT=${4:-/tmp/atoll_pipeline_svg}
LAYERS=${LAYERS:-4} EMBD=${EMBD:-512} B=${B:-4} T=${T:-16} STEPS=${STEPS:-7} THREADS=${THREADS:-1} V=${V:-2}
mkdir -p "$OUT"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pp=$P m=$M layers=$LAYERS d=$EMBD B=$B T=$T threads/rank=$THREADS, median of $((STEPS - 1)) steps"
for s in gpipe 1f1b interleaved zb-h1; do
  v=1; [ "$s" = interleaved ] && v=$V
  "$BUILD/atoll" launch --nproc-per-node "$P" -- "$BUILD/bench/bench_pipeline" "$s" "$v" "$M" "$LAYERS" "$EMBD" "$B" "$T" \
    "$STEPS" "$THREADS" "$OUT/pipeline_$s.svg" 2>&1 | sed -n 's/^\[rank 0\] //p' | grep '^{' >> "$OUT/results.jsonl.tmp"
done
mv "$OUT/results.jsonl.tmp" "$OUT/results.jsonl"
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
idle = {r["schedule"]: r["idle_ms_per_rank"] for r in rows}
print(f"{'schedule':12} {'v':>2} {'step ms':>9} {'bubble':>8} {'ideal':>8} {'diff pp':>8} {'sim*':>7} {'idle ms':>8}  F/B/W ms per micro-batch")
for r in rows:
    print(f"{r['schedule']:12} {r['v']:>2} {r['step_ms']:9.1f} {100*r['bubble']:7.2f}% {100*r['ideal']:7.2f}% "
          f"{100*(r['bubble']-r['ideal']):+8.2f} {100*r['sim_measured_costs']:6.2f}% {r['idle_ms_per_rank']:8.1f}  "
          f"{r['F_ms']:.1f}/{r['B_ms']:.1f}/{r['W_ms']:.1f}  {r['svg']}")
if "zb-h1" in idle and "1f1b" in idle:
    z = [r for r in rows if r["schedule"] == "zb-h1"][0]
    F, B, W = z["F_ms"], z["B_ms"], z["W_ms"]
    print(f"zb-h1 idle time / 1f1b idle time = {idle['zb-h1'] / idle['1f1b']:.2f} (ideal 1/3 when F = B = W; "
          f"(F+B-W)/(F+B+W) = {(F + B - W) / (F + B + W):.2f} at the measured costs)")
print("sim*: the schedule simulated with this run's mean F/B/W costs")
PY
