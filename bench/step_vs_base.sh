#!/usr/bin/env bash
# This build's training step against another build's (say main before a redesign), in one run on
# the same machine: rounds alternate the two bench_gpt_step binaries on d384 and GPT-2 124M at
# (B,T) = (4,256) and print the median tokens/s of each and the median of the per-round ratios.
# usage: bench/step_vs_base.sh BASE_BENCH_GPT_STEP [THREADS] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: $0 BASE_BENCH_GPT_STEP [THREADS] [STEPS] [ROUNDS]}
THREADS=${2:-$(nproc)}
STEPS=${3:-3}
ROUNDS=${4:-5}
NEW=build/bench/bench_gpt_step
[ -x "$NEW" ] || { echo "build first: scripts/build.sh"; exit 1; }
echo "threads=$THREADS steps=$STEPS rounds=$ROUNDS  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
for preset in d384 gpt2; do
  rows=()
  for r in $(seq "$ROUNDS"); do
    b=$(OMP_NUM_THREADS=$THREADS "$BASE" $preset 4 256 "$THREADS" "$STEPS")
    n=$(OMP_NUM_THREADS=$THREADS "$NEW" $preset 4 256 "$THREADS" "$STEPS")
    rows+=("$b|$n")
  done
  /usr/bin/python3 - "$preset" "${rows[@]}" <<'PY'
import json, statistics as st, sys
label, rows = sys.argv[1], [r.split("|") for r in sys.argv[2:]]
B = [json.loads(r[0]) for r in rows]; N = [json.loads(r[1]) for r in rows]
per = [n["tokens_per_s"] / b["tokens_per_s"] for b, n in zip(B, N)]
ratio = st.median(per)
same = all(b["loss"] == n["loss"] for b, n in zip(B, N))
print(f"{label:<6} base {st.median([b['tokens_per_s'] for b in B]):9.1f} tok/s  this {st.median([n['tokens_per_s'] for n in N]):9.1f} tok/s"
      f"  ratio {ratio:5.3f}x  (per-round: {' '.join('%.2f' % x for x in per)})"
      f"  loss {'identical' if same else 'DIFFERS'}")
PY
done
