#!/usr/bin/env bash
# The optimizer quality benchmark on real English text (issue 17): a 5.8M-parameter GPT
# (configs/optim_text.toml) on the King James Bible + the GCIDE dictionary + Debian's fortunes,
# tokenized by a 4096-id BPE trained on the corpus, the same tokens for every optimizer
# (800 steps x 4096 = 3.3M), a 3-rate sweep per optimizer (seed 1), then SEEDS seeds at the best
# rate, then the PRMuon period, the PRMuon row-step definition and the Dion3 fraction at that rate.
# Writes runs/optim_text/report.md (final val loss, tokens to AdamW's final loss, optimizer step
# time) and runs/optim_text/loss_curves.svg. Outside CI: hours at full size on one core.
#
# usage: tools/optim_quality_text.sh [--short]          (build first: scripts/build.sh)
#   --short: a pipeline check of a few minutes (2 layers, d = 64, 150 steps of 512 tokens, 2 MB of the
#            dictionary); its numbers say nothing about the optimizers.
#   --mid:   4 layers, d = 128 (1.3M parameters), 240 steps of 2048 tokens (0.49M), the whole corpus:
#            about an hour on one core; a small-scale check, not the benchmark.
# env: SEEDS (2), ONLY="muon soap" (cases to run), ONLY_VARIANTS="prmuon-K2" (variants to run),
#      ADAMW_RATES, MATRIX_RATES, PRMUON_RATES, DION3_RATES, SOAP_RATES (grids: the Muon family's default, PRMuon's,
#      Dion3's, SOAP's; a first pass at one rate each can be widened later: finished runs are kept), THREADS (1), DTYPE (f32 | bf16),
#      GCIDE_MB (0: the whole dictionary), OUT (runs/optim_text), ATOLL (build/atoll),
#      EXTRA (more overrides for every run).
#
# Matrix optimizers are RMS-matched so that one learning-rate grid means the same step size for
# all of them: Muon, PRMuon and Dion3 with update_scale = "rms" (0.2 sqrt(max(m, n)), Liu et al.),
# SOAP with update_rms = 0.2; the embeddings, the tied head and the vectors stay on AdamW at
# 3e-3 (the config's) in every run.
set -euo pipefail
cd "$(dirname "$0")/.."
SHORT=0
[ "${1:-}" = "--short" ] && SHORT=1
[ "${1:-}" = "--mid" ] && SHORT=2
ATOLL=${ATOLL:-build/atoll}
OUT=${OUT:-runs/optim_text}
SEEDS=${SEEDS:-2}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS
GCIDE_MB=${GCIDE_MB:-0}
SAMPLE_MB=8
COMMON=(--train.threads="$THREADS" --train.dtype="${DTYPE:-f32}")
if [ $SHORT = 1 ]; then
  [ "$OUT" = runs/optim_text ] && OUT=runs/optim_text_short
  GCIDE_MB=2; SAMPLE_MB=1
  COMMON+=(--model.n_layer=2 --model.n_embd=64 --model.n_head=2 --model.block_size=64 --train.seq_len=64
           --train.batch_size=8 --train.steps=150 --train.warmup_steps=10 --eval.every=15 --eval.steps=4)
elif [ $SHORT = 2 ]; then  # --mid: the quality table's model size on this corpus, 0.6M tokens
  [ "$OUT" = runs/optim_text ] && OUT=runs/optim_text_mid
  COMMON+=(--model.n_layer=4 --model.n_embd=128 --model.n_head=4 --model.block_size=128 --train.seq_len=128
           --train.batch_size=16 --train.steps=240 --train.warmup_steps=20 --eval.every=30 --eval.steps=8)
fi
mkdir -p "$OUT"
COMMON+=(--data.dir="$OUT/data" --data.tokenizer="$OUT/bpe4096")

# ---- data: corpus files, tokenizer, shards (each skipped when already there)
if [ ! -s "$OUT/corpus/gcide.txt" ]; then
  python3 tools/optim_text_corpus.py "$OUT/corpus" --gcide-mb "$GCIDE_MB" --sample-mb "$SAMPLE_MB"
fi
if [ ! -s "$OUT/bpe4096/vocab.bpe" ]; then
  "$ATOLL" tokenizer train --input "$OUT/corpus/bpe_sample.txt" --vocab-size 4096 --out "$OUT/bpe4096"
fi
mapfile -t FORTUNES < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '.*' | sort)
[ ${#FORTUNES[@]} -gt 0 ] || { echo "no fortunes in /usr/share/games/fortunes: run scripts/setup.sh" >&2; exit 1; }
"$ATOLL" data prepare --input "$OUT/corpus/kjv.txt" "$OUT/corpus/gcide.txt" "${FORTUNES[@]}" \
  --tokenizer "$OUT/bpe4096" --out "$OUT/data"

# ---- the runs
# name | overrides | key the rate goes to | rates
MATRIX_RATES=${MATRIX_RATES:-"3e-3 1e-2 3e-2"}
SOAP_RATES=${SOAP_RATES:-"1e-3 3e-3 1e-2"}
CASES=(
  "adamw|--optim.type=adamw|optim.adamw.lr|${ADAMW_RATES:-1e-3 3e-3 1e-2}"
  "muon|--optim.type=muon --optim.muon.update_scale=rms|optim.muon.lr|$MATRIX_RATES"
  "prmuon-K4|--optim.type=prmuon --optim.prmuon.period=4 --optim.prmuon.update_scale=rms|optim.prmuon.lr|${PRMUON_RATES:-$MATRIX_RATES}"
  "dion3-a0.25|--optim.type=dion3 --optim.dion3.fraction=0.25 --optim.dion3.update_scale=rms|optim.dion3.lr|${DION3_RATES:-$MATRIX_RATES}"
  "soap|--optim.type=soap --optim.soap.precondition_frequency=1 --optim.soap.factor_update=kl --optim.soap.correct_shampoo_bias=true --optim.soap.update_rms=0.2|optim.soap.lr|$SOAP_RATES"
)
# variants run at their case's best rate, seed 1: name | case | extra overrides
VARIANTS=(
  "prmuon-K2|prmuon-K4|--optim.prmuon.period=2"
  "prmuon-K8|prmuon-K4|--optim.prmuon.period=8"
  "prmuon-K4-paper|prmuon-K4|--optim.prmuon.row_scale=frobenius --optim.prmuon.axis=neurons"
  "prmuon-K4-neurons|prmuon-K4|--optim.prmuon.axis=neurons"
  "prmuon-K4-frobenius|prmuon-K4|--optim.prmuon.row_scale=frobenius"
  "dion3-a0.125|dion3-a0.25|--optim.dion3.fraction=0.125"
  "dion3-a0.5|dion3-a0.25|--optim.dion3.fraction=0.5"
)
MANIFEST="$OUT/manifest.tsv"
: >"$MANIFEST"
run() {  # group name lr seed key overrides... -> prints the final val loss
  local group=$1 name=$2 lr=$3 seed=$4 key=$5; shift 5
  local dir="$OUT/runs/$name-lr$lr-s$seed"
  mkdir -p "$OUT/runs"
  printf "%s\t%s\t%s\t%s\t%s\n" "$group" "$name" "$lr" "$seed" "$dir" >>"$MANIFEST"
  if ! grep -q "done: step" "$dir.log" 2>/dev/null || [ -n "${FRESH:-}" ]; then  # finished runs are kept
    rm -rf "$dir"
    "$ATOLL" train configs/optim_text.toml --run.dir="$dir" --train.seed="$seed" --"$key"="$lr" \
      "${COMMON[@]}" "$@" ${EXTRA:-} >"$dir.log" 2>&1 || { echo "nan"; return; }
  fi
  grep -o '"val_loss":[0-9.eE+-]*' "$dir/metrics.jsonl" | tail -1 | cut -d: -f2
}
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
declare -A BEST KEY OV
for c in "${CASES[@]}"; do
  IFS='|' read -r name ov key lrs <<<"$c"
  wanted "$name" || continue
  KEY[$name]=$key; OV[$name]=$ov
  best=""; bestv=1e9
  for lr in $lrs; do
    v=$(run sweep "$name" "$lr" 1 "$key" $ov)
    echo "sweep $name lr $lr: $v"
    if [ "$v" != "nan" ] && awk "BEGIN{exit !($v < $bestv)}"; then bestv=$v; best=$lr; fi
  done
  BEST[$name]=$best
  [ -n "$best" ] || { echo "$name: every rate diverged" >&2; continue; }
  for s in $(seq 1 "$SEEDS"); do
    v=$(run best "$name" "$best" "$s" "$key" $ov)
    echo "best $name lr $best seed $s: $v"
  done
done
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name base extra <<<"$v"
  [ -n "${BEST[$base]:-}" ] || continue
  [ -z "${ONLY_VARIANTS:-}" ] || [[ " $ONLY_VARIANTS " == *" $name "* ]] || continue
  x=$(run variant "$name" "${BEST[$base]}" 1 "${KEY[$base]}" ${OV[$base]} $extra)
  echo "variant $name lr ${BEST[$base]}: $x"
done
python3 tools/optim_quality_report.py "$OUT" --short "$SHORT" | tee "$OUT/report.md"
