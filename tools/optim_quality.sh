#!/usr/bin/env bash
# The optimizer quality table (issue 5): validation loss after the same number of tokens on the
# default corpus, each optimizer at its best learning rate from a small sweep, then that rate over
# several seeds. Prints the sweep and the table as Markdown.
# usage: tools/optim_quality.sh [STEPS] [SEEDS]      (build first: scripts/build.sh)
# ATOLL_EXTRA="--train.threads=1" adds overrides to every run; ONLY="muon prmuon-K4" runs only
# those cases.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
SEEDS=${2:-3}
ATOLL=${ATOLL:-build/atoll}
OUT=runs/optim_quality
mkdir -p "$OUT"
# name | overrides | learning rates to sweep (the key each rate goes to)
CASES=(
  "adamw|--optim.type=adamw|optim.adamw.lr|1e-3 3e-3 1e-2"
  "muon|--optim.type=muon|optim.muon.lr|0.01 0.02 0.03 0.05"
  "prmuon-K4|--optim.type=prmuon --optim.prmuon.period=4 --optim.prmuon.row_scale=fit|optim.prmuon.lr|0.01 0.02 0.03 0.05"
  "dion3-a0.25|--optim.type=dion3 --optim.dion3.fraction=0.25|optim.dion3.lr|0.01 0.02 0.05"
  "adamw+ember|--optim.type=adamw --optim.embed=ember --optim.head=ember|optim.ember.lr|1e-3 3e-3 1e-2 3e-2"
)
run() {  # name seed key lr overrides... -> prints the final val loss
  local name=$1 seed=$2 key=$3 lr=$4; shift 4
  local dir="$OUT/$name-lr$lr-s$seed"
  "$ATOLL" train configs/default.toml --run.dir="$dir" --overwrite --train.steps="$STEPS" --train.seed="$seed" \
    --eval.every="$STEPS" --sample.every=0 --checkpoint.every=0 --log.every=1000 --"$key"="$lr" "$@" ${ATOLL_EXTRA:-} >"$dir.log" 2>&1 \
    || { echo "nan"; return; }
  python3 tools/metrics_jsonl.py "$dir/metrics.jsonl" val_loss | tail -1
}
echo "## Sweep (seed 1, $STEPS steps)"
echo "| optimizer | lr | val loss |"; echo "|---|---|---|"
declare -A BEST
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
for c in "${CASES[@]}"; do
  IFS='|' read -r name ov key lrs <<<"$c"
  wanted "$name" || continue
  best=""; bestv=1e9
  for lr in $lrs; do
    v=$(run "$name" 1 "$key" "$lr" $ov)
    echo "| $name | $lr | $v |"
    if [ "$v" != "nan" ] && awk "BEGIN{exit !($v < $bestv)}"; then bestv=$v; best=$lr; fi
  done
  BEST[$name]=$best
done
echo; echo "## Best learning rate, $SEEDS seeds"
echo "| optimizer | lr | val loss (mean) | per seed |"; echo "|---|---|---|---|"
for c in "${CASES[@]}"; do
  IFS='|' read -r name ov key lrs <<<"$c"
  wanted "$name" || continue
  lr=${BEST[$name]}; vals=()
  for s in $(seq 1 "$SEEDS"); do vals+=("$(run "$name" "$s" "$key" "$lr" $ov)"); done
  mean=$(printf "%s\n" "${vals[@]}" | awk '{s+=$1} END{printf "%.4f", s/NR}')
  echo "| $name | $lr | $mean | ${vals[*]} |"
done
