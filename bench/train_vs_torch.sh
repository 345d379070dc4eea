#!/usr/bin/env bash
# atoll vs PyTorch on the same GPT, batch, thread count and machine, in one run.
# Each round runs atoll fp32, PyTorch fp32, atoll bf16 (mixed precision) and PyTorch bf16
# (torch.autocast) back to back; the table gives the median over ROUNDS of tokens/s (each itself a
# median over STEPS steps), the medians of the per-round ratios, atoll's fp32 MFU against the
# fp32 GEMM peak measured in the same run, and peak resident memory. The first lines print the CPU
# model, the ISA path atoll detected and the load average: the machine may be shared.
# usage: bench/train_vs_torch.sh [THREADS] [STEPS] [ROUNDS] [MODELS="d384 gpt2"]   (build first)
#   d384: the default model, d=384 L=6 V=8192, B=8 T=256;  gpt2: GPT-2 124M, B=4 T=256
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
STEPS=${2:-3}
ROUNDS=${3:-3}
MODELS=${4:-"d384 gpt2"}
BIN=build/bench/bench_gpt_step
[ -x "$BIN" ] || { echo "build first: scripts/build.sh"; exit 1; }
echo "threads=$THREADS steps=$STEPS rounds=$ROUNDS  cpu:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
[ -x build/atoll ] && build/atoll bench gemm --quick --repeats 1 --threads 1 | head -2 || true
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-22s %9s %9s %6s %9s %9s %6s %6s %6s %9s %9s %9s\n" "model (B,T)" "atoll f32" "torch f32" "ratio" \
  "atoll b16" "torch b16" "ratio" "b16/32" "MFU32" "RSS f32" "RSS b16" "torch RSS"
run() {
  local label=$1; shift
  local rows=()
  for r in $(seq "$ROUNDS"); do
    a=$(OMP_NUM_THREADS=$THREADS "$BIN" "$@")
    t=$(OMP_NUM_THREADS=$THREADS /usr/bin/python3 tools/bench_torch_gpt.py "$@")
    b=$(OMP_NUM_THREADS=$THREADS ATOLL_BENCH_DTYPE=bf16 "$BIN" "$@")
    u=$(OMP_NUM_THREADS=$THREADS TORCH_BENCH_AUTOCAST=bf16 /usr/bin/python3 tools/bench_torch_gpt.py "$@")
    rows+=("$a|$t|$b|$u")
  done
  /usr/bin/python3 - "$label" "${rows[@]}" <<'PY'
import json, statistics as st, sys
label, rows = sys.argv[1], [r.split("|") for r in sys.argv[2:]]
A, T, B, U = ([json.loads(r[i]) for r in rows] for i in range(4))
med = st.median
tps = lambda xs: med([x["tokens_per_s"] for x in xs])
ratio = lambda xs, ys: med([x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(xs, ys)])
mb = lambda xs, k="max_rss_bytes": med([x[k] for x in xs]) / 2**20
print(f"{label:<22} {tps(A):9.0f} {tps(T):9.0f} {ratio(A, T):5.2f}x {tps(B):9.0f} {tps(U):9.0f} {ratio(B, U):5.2f}x "
      f"{ratio(B, A):5.2f}x {100*med([a['mfu'] for a in A]):5.1f}% {mb(A):7.0f}MB {mb(B):7.0f}MB {mb(T):7.0f}MB")
print(f"{'':<22} peak tensor bytes: fp32 {mb(A, 'peak_tensor_bytes'):.0f} MB, bf16 {mb(B, 'peak_tensor_bytes'):.0f} MB "
      f"({mb(B, 'peak_tensor_bytes') / mb(A, 'peak_tensor_bytes'):.2f}x)")
PY
}
for m in $MODELS; do
  case $m in
    d384) run "d384 L6 V8192 (8,256)" d384 8 256 "$THREADS" "$STEPS" 6 384 6 8192 ;;
    gpt2) run "GPT-2 124M (4,256)" gpt2 4 256 "$THREADS" "$STEPS" ;;
    *) echo "unknown model $m (d384 or gpt2)"; exit 1 ;;
  esac
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
