#!/usr/bin/env bash
# atoll's GEMM paths vs PyTorch's torch.matmul (oneDNN/MKL inside) on the training's real shapes
# (forward, dX, dW of every linear layer), in one run on the same machine and thread count.
# Each round runs `atoll bench gemm` then PyTorch on the same shapes; per shape it prints the
# medians over ROUNDS of GFLOP/s and of the per-round ratio atoll/PyTorch, for fp32 and bf16 (the
# paths in use), then the median ratio over the shapes. Prints the CPU model and load average.
# usage: bench/gemm_vs_torch.sh [THREADS] [REPEATS] [ROUNDS] [MODEL=d384|gpt2]     (build first)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
REPEATS=${2:-7}
ROUNDS=${3:-3}
MODEL=${4:-d384}
BIN=build/atoll
[ -x "$BIN" ] || { echo "build first: scripts/build.sh"; exit 1; }
DIR=$(mktemp -d /tmp/atoll_gemm.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
echo "cpu:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)  threads=$THREADS repeats=$REPEATS rounds=$ROUNDS model=$MODEL"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  OMP_NUM_THREADS=$THREADS "$BIN" bench gemm --threads "$THREADS" --repeats "$REPEATS" --model "$MODEL" \
    --json "$DIR/atoll$r.json" > "$DIR/atoll$r.txt"
  OMP_NUM_THREADS=$THREADS /usr/bin/python3 bench/torch_gemm.py "$DIR/atoll$r.json" "$THREADS" "$REPEATS" > "$DIR/torch$r.json"
done
sed -n '1,2p' "$DIR/atoll1.txt"
/usr/bin/python3 - "$DIR" "$ROUNDS" <<'PY'
import json, statistics as st, sys
d, n = sys.argv[1], int(sys.argv[2])
A = [json.load(open(f"{d}/atoll{r}.json")) for r in range(1, n + 1)]
T = [json.load(open(f"{d}/torch{r}.json")) for r in range(1, n + 1)]
# fp32: per shape the library the fp32 setting takes there (auto picks OpenBLAS or oneDNN by layout).
p32 = "fp32_gflops"
p16 = ("bf16 onednn" if A[0]["bf16_path"].startswith("onednn") else
       {"avx512_bf16": "bf16 avx512_bf16"}.get(A[0]["bf16_path"], "bf16 portable"))
alt = [k for k in A[0]["sizes"][0] if k.startswith(("fp32 ", "bf16 ", "int8")) and k not in (p32, p16)]
print(f"atoll paths in use: fp32 {A[0].get('fp32_gemm', '?')}, {p16} (isa {A[0]['isa']}); PyTorch {T[0]['torch']}; "
      f"medians of {n} rounds")
print(f"{'shape':<15}{'atoll f32':>10}{'torch f32':>10}{'ratio':>7}{'atoll bf16':>11}{'torch bf16':>11}{'ratio':>7}   "
      + " ".join(f"{k:>16}" for k in alt))
m = st.median
r32s, r16s = [], []
for i, s in enumerate(A[0]["sizes"]):
    g = lambda k: m([a["sizes"][i][k] for a in A])
    t = lambda k: m([x["sizes"][i][k] for x in T])
    r32 = m([a["sizes"][i][p32] / x["sizes"][i]["fp32"] for a, x in zip(A, T)])
    r16 = m([a["sizes"][i][p16] / x["sizes"][i]["bf16"] for a, x in zip(A, T)])
    r32s.append(r32); r16s.append(r16)
    print(f"{s['shape']:<15}{g(p32):10.1f}{t('fp32'):10.1f}{r32:6.2f}x{g(p16):11.1f}{t('bf16'):11.1f}{r16:6.2f}x   "
          + " ".join(f"{g(k):16.1f}" for k in alt))
print(f"{'median ratio':<15}{'':>10}{'':>10}{m(r32s):6.2f}x{'':>11}{'':>11}{m(r16s):6.2f}x")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
