#!/usr/bin/env bash
# Compressed gradient exchange vs f32 DDP, same GPT, data, tokens and seeds, 2 ranks, in one run:
#  - direct FP8 (E4M3, block scales) vs GIFT FP8 vs f32 DDP: final validation loss;
#  - NVFP4 with stochastic rounding (and int8 with error feedback): loss and bytes vs f32;
#  - SCAPE at 90% / 99% vs dense AdamS (DDP): loss and bytes, indices included.
# Bytes are what each rank put on the wire, as counted by the reducer (DDP) and SCAPE (their log
# lines at the end of a run), over f32 ring all-reduce's bytes for the same tensors.
# There is no PyTorch peer for these codecs: the f32 run of the same engine is the reference.
# usage: bench/codecs_vs_f32.sh [STEPS] [SEEDS...]   (default 150 steps, seeds 1 2)
# (build first: cmake --build build --target atoll)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-150}
shift || true
SEEDS=${*:-1 2}
BUILD=${BUILD:-build}
ATOLL=$BUILD/atoll
[ -x "$ATOLL" ] || { echo "build first: cmake --build $BUILD --target atoll"; exit 1; }
OUT=${OUT:-/tmp/atoll_bench_codecs_$$}
mkdir -p "$OUT"
ADAMS="--optim.type=adams --optim.adams.lr=3e-3 --optim.adams.weight_decay=0.1"
declare -A ARGS=(
  [f32]="--parallel.codec=none"
  [fp8_e4m3]="--parallel.codec=fp8_e4m3"
  [gift_fp8]="--parallel.codec=gift_fp8"
  [nvfp4_sr]="--parallel.codec=nvfp4 --parallel.codec_rounding=stochastic"
  [int8_ef]="--parallel.codec=int8 --parallel.error_feedback=true"
  [adams]="$ADAMS"
  [scape90]="$ADAMS --parallel.strategy=scape --parallel.scape_sparsity=0.9"
  [scape99]="$ADAMS --parallel.strategy=scape --parallel.scape_sparsity=0.99"
  [scape90d]="$ADAMS --parallel.strategy=scape --parallel.scape_sparsity=0.9 --parallel.scape_update=dense"
  [scape99d]="$ADAMS --parallel.strategy=scape --parallel.scape_sparsity=0.99 --parallel.scape_update=dense"
)
METHODS=${METHODS:-"f32 fp8_e4m3 gift_fp8 nvfp4_sr int8_ef adams scape90 scape99"}
for m in $METHODS; do
  for s in $SEEDS; do
    "$ATOLL" launch --nproc-per-node 2 -- "$ATOLL" train bench/codecs.toml --train.steps=$STEPS --eval.every=$STEPS \
      --train.seed=$s --run.dir="$OUT/run_${m}_$s" ${ARGS[$m]} > "$OUT/$m.$s.log" 2>&1 || { echo "$m seed $s failed:"; tail -5 "$OUT/$m.$s.log"; }
  done
done
/usr/bin/python3 - "$OUT" "$METHODS" "$SEEDS" "$STEPS" <<'PY'
import re, sys, statistics, platform
out, methods, seeds, steps = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res = {}
for m in methods:
    losses, ratio, gift = [], None, ""
    for s in seeds:
        t = open(f"{out}/{m}.{s}.log").read()
        v = re.findall(r"done: step \d+ loss [\d.]+ val loss ([\d.]+)", t)
        if v: losses.append(float(v[-1]))
        r = re.search(r"([\d.]+)x fewer than f32", t)
        if r: ratio = float(r.group(1))
        r = re.search(r", ([\d.]+) of DDP's f32", t)
        if r: ratio = 1 / float(r.group(1))
        g = re.search(r"GIFT on (\d+) of (\d+) matrices", t)
        if g: gift = f"GIFT on {g.group(1)}/{g.group(2)} matrices at the end"
    res[m] = (losses, ratio, gift)
params = re.search(r"\(([\d.]+M) parameters\)", open(f"{out}/{methods[0]}.{seeds[0]}.log").read())
print(f"CPU: {cpu}; 2 ranks x 1 thread, GPT {params.group(1) if params else '?'} params, {steps} steps, seeds {' '.join(seeds)}")
print("(figures under load: the machine is shared)")
def ref_of(m): return "adams" if m.startswith("scape") or m == "adams" else "f32"
print(f"{'method':<10}{'val loss (mean)':>16}{'per seed':>24}{'vs ref':>10}{'bytes: x fewer':>16}  notes")
for m in methods:
    losses, ratio, gift = res[m]
    if not losses:
        print(f"{m:<10}  (did not run)"); continue
    mean = statistics.mean(losses)
    ref = res.get(ref_of(m), ([],))[0]
    rel = (mean / statistics.mean(ref) - 1) * 100 if ref and m != ref_of(m) else 0.0
    per = " ".join(f"{l:.4f}" for l in losses)
    rs = f"{ratio:.2f}" if ratio else "1.00"
    print(f"{m:<10}{mean:16.4f}{per:>24}{rel:+9.2f}%{rs:>16}  ref {ref_of(m)} {gift}")
PY
