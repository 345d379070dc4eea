#!/usr/bin/env bash
# atoll vs PyTorch on the same GPT, batch, thread count and machine, in one run.
# Each round runs atoll fp32, PyTorch fp32 and atoll bf16 (mixed precision) back to back; the
# table gives the median over ROUNDS of tokens/s (each itself a median over STEPS steps), the
# median of the per-round ratios, MFU against the fp32 GEMM peak measured in the same run, and
# peak resident memory.
# usage: bench/train_vs_torch.sh [THREADS] [STEPS] [ROUNDS]     (build first: scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
STEPS=${2:-3}
ROUNDS=${3:-3}
BIN=build/bench/bench_gpt_step
[ -x "$BIN" ] || { echo "build first: scripts/build.sh"; exit 1; }
echo "threads=$THREADS steps=$STEPS rounds=$ROUNDS  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
printf "%-22s %10s %10s %7s %10s %7s %7s %9s %9s\n" "model (B,T)" "atoll f32" "torch f32" "ratio" "atoll bf16" "ratio" "MFU" "atoll RSS" "torch RSS"
run() {
  local label=$1; shift
  local rows=()
  for r in $(seq "$ROUNDS"); do
    a=$(OMP_NUM_THREADS=$THREADS "$BIN" "$@")
    t=$(OMP_NUM_THREADS=$THREADS /usr/bin/python3 tools/bench_torch_gpt.py "$@")
    b=$(OMP_NUM_THREADS=$THREADS ATOLL_BENCH_DTYPE=bf16 "$BIN" "$@")
    rows+=("$a|$t|$b")
  done
  /usr/bin/python3 - "$label" "${rows[@]}" <<'PY'
import json, statistics as st, sys
label, rows = sys.argv[1], [r.split("|") for r in sys.argv[2:]]
A = [json.loads(r[0]) for r in rows]; T = [json.loads(r[1]) for r in rows]; B = [json.loads(r[2]) for r in rows]
med = lambda xs: st.median(xs)
ra = med([a["tokens_per_s"] / t["tokens_per_s"] for a, t in zip(A, T)])
rb = med([b["tokens_per_s"] / t["tokens_per_s"] for b, t in zip(B, T)])
print(f"{label:<22} {med([a['tokens_per_s'] for a in A]):10.0f} {med([t['tokens_per_s'] for t in T]):10.0f} {ra:6.2f}x "
      f"{med([b['tokens_per_s'] for b in B]):10.0f} {rb:6.2f}x {100*med([a['mfu'] for a in A]):6.1f}% "
      f"{med([a['max_rss_bytes'] for a in A])/2**20:7.0f}MB {med([t['max_rss_bytes'] for t in T])/2**20:7.0f}MB")
PY
}
run "d384 L6 (4,256)" d384 4 256 "$THREADS" "$STEPS"
run "GPT-2 124M (4,256)" gpt2 4 256 "$THREADS" "$STEPS"
