#!/usr/bin/env bash
# The MoE optimisation ladder (issue 12, item 7; seed: SLAI T-Rex's MFU ladder for MoE training):
# the `moe` family trained by `atoll train` on 2 ranks (dp_shard = 2, experts over ep = 2), with
# each optimisation switched on cumulatively, one row each, through the engine's own config keys:
#   1 baseline         model.expert_gemm = loop (one dense linear per expert), all-gather
#                      dispatcher, recompute = full (every block reruns its forward), fp32
#   2 + grouped GEMM   model.expert_gemm = grouped (one grouped GEMM per projection)
#   3 + all-to-all     parallel.ep_dispatcher = all_to_all (instead of all_gather)
#   4 + tile overlap   parallel.ep_overlap = true (experts in tiles, sent as they finish)
#   5 + recompute      train.recompute = selective (only the attention core is recomputed)
#   6 + bf16           train.dtype = bf16 (bf16 matmuls for attention, shared experts, head)
# then a dense twin of equal ACTIVE parameters on the same tokens with row 6's settings: the same
# family with every layer dense (n_dense_layers = n_layer), each FFN of top_k * expert_ffn +
# n_shared * shared_ffn hidden units (= moe-small's dense_ffn, 256), i.e. the MoE without routing.
#
# Every rung is a separate `atoll launch` job; the rungs are run in turn, ROUNDS times over
# (alternating, so load drifts hit every row alike), and each row is the median over rounds of
# the per-run median step (steps after the first two). MFU is the trainer's (model FLOPs per token,
# active parameters only, times tokens/s, over peak x ranks) with ONE peak for every row: the fp32
# GEMM peak of one thread measured once at the start (`atoll bench gemm`), or PEAK_GFLOPS; the bf16
# row is thus against the same fp32 peak (its gain shows as MFU above the fp32 rows).
# usage: bench/moe_ladder.sh [ROUNDS=3] [STEPS=8] [BATCH=8] [SEQ=128]   (build: atoll)
# No PyTorch peer: the comparison is within atoll (each rung against the previous, MoE vs dense).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; STEPS=${2:-8}; BATCH=${3:-8}; SEQ=${4:-128}
ATOLL=${ATOLL:-build/atoll}
[ -x "$ATOLL" ] || { echo "build first: cmake --build build --target atoll"; exit 1; }
OUT=${OUT:-runs/moe-ladder}
mkdir -p "$OUT"
echo "cpu:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -z "${PEAK_GFLOPS:-}" ]; then
  OMP_NUM_THREADS=1 "$ATOLL" bench gemm --threads 1 --repeats 3 --json "$OUT/peak.json" > "$OUT/peak.txt"
  PEAK_GFLOPS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fp32_gflops'])" "$OUT/peak.json")
fi
echo "peak (one thread, fp32, for every row's MFU): $PEAK_GFLOPS GFLOP/s"

common=(configs/moe-small.toml --train.steps="$STEPS" --train.batch_size="$BATCH" --train.seq_len="$SEQ"
        --train.threads=1 --eval.every=0 --checkpoint.every=0 --sample.every=0 --log.every=1
        --parallel.dp_shard=2 --hardware.peak_gflops="$PEAK_GFLOPS")
names=("1 baseline: loop of experts, all_gather, recompute full, fp32" "2 + grouped GEMM" "3 + all_to_all dispatcher"
       "4 + tile overlap" "5 + recompute selective" "6 + bf16 matmuls" "dense twin (equal active), as 6")
flags=("--model.expert_gemm=loop --parallel.ep=2 --parallel.ep_dispatcher=all_gather --train.recompute=full --train.dtype=f32"
       "--model.expert_gemm=grouped --parallel.ep=2 --parallel.ep_dispatcher=all_gather --train.recompute=full --train.dtype=f32"
       "--model.expert_gemm=grouped --parallel.ep=2 --parallel.ep_dispatcher=all_to_all --train.recompute=full --train.dtype=f32"
       "--model.expert_gemm=grouped --parallel.ep=2 --parallel.ep_dispatcher=all_to_all --parallel.ep_overlap=true --train.recompute=full --train.dtype=f32"
       "--model.expert_gemm=grouped --parallel.ep=2 --parallel.ep_dispatcher=all_to_all --parallel.ep_overlap=true --train.recompute=selective --train.dtype=f32"
       "--model.expert_gemm=grouped --parallel.ep=2 --parallel.ep_dispatcher=all_to_all --parallel.ep_overlap=true --train.recompute=selective --train.dtype=bf16"
       "--model.n_dense_layers=4 --train.recompute=selective --train.dtype=bf16")
# REPORT_ONLY=1: only the table, from the runs already under $OUT.
for r in $( [ -n "${REPORT_ONLY:-}" ] || seq "$ROUNDS"); do
  for i in "${!names[@]}"; do
    dir="$OUT/rung$i-round$r"
    rm -rf "$dir"
    # shellcheck disable=SC2086
    "$ATOLL" launch --nproc-per-node 2 -- "$ATOLL" train "${common[@]}" --run.dir="$dir" ${flags[$i]} \
      > "$OUT/rung$i-round$r.log" 2>&1 || { echo "rung $i round $r failed: $OUT/rung$i-round$r.log"; tail -5 "$OUT/rung$i-round$r.log"; exit 1; }
    echo "round $r ${names[$i]}: done (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ROUNDS" "${names[@]}" <<'PY'
import json, statistics as st, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(i, r):
    recs = [json.loads(l) for l in open(f"{out}/rung{i}-round{r}/metrics.jsonl") if '"tokens_per_s"' in l]
    recs = recs[2:] if len(recs) > 3 else recs  # the first steps warm caches and buffers up
    return (st.median(x["tokens_per_s"] for x in recs), st.median(x["mfu"] for x in recs),
            [round(x["loss"], 4) for x in recs])
rows, per_round = [], []
for i, n in enumerate(names):
    runs = [run(i, r) for r in range(1, rounds + 1)]
    per_round.append([x[0] for x in runs])
    rows.append((n, st.median(x[0] for x in runs), st.median(x[1] for x in runs), [round(x[0]) for x in runs]))
# Paired: each round's rung over the previous rung of the same round (run just before it), the
# median over rounds; slow load drifts cancel in a pair.
def paired(a, b):
    return st.median(x / y for x, y in zip(per_round[a], per_round[b]))
print(f"| rung | tokens/s (median of {rounds}) | MFU | x previous (paired) | x baseline (paired) | per round |")
print("|---|---:|---:|---:|---:|---|")
last = len(rows) - 1
for i, (n, t, m, per) in enumerate(rows):
    prev = "" if i == 0 or i == last else f"{paired(i, i - 1):.2f}"
    base = "" if i == last else f"{paired(i, 0):.2f}"
    print(f"| {n} | {t:.0f} | {100 * m:.1f}% | {prev} | {base} | {per} |")
print(f"MoE (rung 6) tokens/s over the dense twin's (paired, same round): {paired(5, last):.2f}; "
      f"ratio of medians {rows[5][1] / rows[last][1]:.2f}")
losses = {tuple(run(i, r)[2]) for i in range(0, 5) for r in range(1, rounds + 1)}
print("losses of the fp32 rungs 1-5 identical across rungs and rounds:", len(losses) == 1)
PY
