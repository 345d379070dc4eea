#!/usr/bin/env bash
# atoll vs PyTorch on the same GPT, batch, thread count and machine, in one run.
# Prints tokens/s for both, their ratio, MFU and peak memory (medians over STEPS steps).
# usage: bench/train_vs_torch.sh [THREADS] [STEPS]     (build first: scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
STEPS=${2:-5}
BIN=build/bench/bench_gpt_step
[ -x "$BIN" ] || { echo "build first: scripts/build.sh"; exit 1; }
printf "%-28s %12s %12s %8s %8s %10s %10s\n" "model (B,T)" "atoll tok/s" "torch tok/s" "ratio" "MFU" "atoll RSS" "torch RSS"
run() {
  local label=$1; shift
  local a t
  a=$(OMP_NUM_THREADS=$THREADS "$BIN" "$@")
  t=$(OMP_NUM_THREADS=$THREADS /usr/bin/python3 tools/bench_torch_gpt.py "$@")
  /usr/bin/python3 - "$label" "$a" "$t" <<'PY'
import json, sys
label, a, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{label:<28} {a['tokens_per_s']:12.0f} {t['tokens_per_s']:12.0f} {a['tokens_per_s']/t['tokens_per_s']:7.2f}x "
      f"{100*a['mfu']:7.1f}% {a['max_rss_bytes']/2**20:8.0f}MB {t['max_rss_bytes']/2**20:8.0f}MB")
PY
}
run "d384 L6 (4,256)" d384 4 256 "$THREADS" "$STEPS"
run "GPT-2 124M (4,256)" gpt2 4 256 "$THREADS" "$STEPS"
