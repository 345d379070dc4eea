#!/usr/bin/env bash
# Predicted vs measured step time of atoll's own CPU training (issue 4: "within 15%").
# For each model size, trains on 1 rank and on 2 ranks (`atoll launch`), one thread per rank, and
# compares with `atoll plan --from-atoll` on the cpu-local device (2 ranks: devices_per_node = 2,
# data parallel). Prints a markdown table.
#
#   tools/plan_self_check.sh [ATOLL_BINARY] [--no-calibrate]
#
# Two measurements per run:
#  * wall: the median step_ms of metrics.jsonl after the first 2 steps (what the issue asks for);
#  * cpu: CPU seconds per step and rank, from two runs of STEPS and STEPS/3 steps
#    ((cpu_long - cpu_short) / (steps_long - steps_short) / ranks: start-up cancels out), the
#    median over REPEATS such pairs (start-up varies by tens of ms under load, which at 12 steps
#    of the smallest model is ±20%: use STEPS=36 REPEATS=3 there). On a
#    shared machine (load average > cores) the wall time mostly measures the scheduler; the CPU
#    time is what the step costs when the ranks have their cores, which is what the model predicts.
# Calibration runs with one thread (one core); the 2-rank device is that core twice, with the
# shared memory bandwidth measured on two threads (see CAL2 below).
# Sizes: "n_layer:n_embd:n_head" words in $SIZES. Takes a few minutes on 2 cores (x REPEATS).
# Calibration times kernels by CPU time (one thread), so it can run under load; rerun it when the
# machine is quietest and pass it with ATOLL_PLAN_CALIBRATION=... --no-calibrate.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/build/atoll}"
CALIBRATE=1
[[ "${2:-}" == "--no-calibrate" ]] && CALIBRATE=0
SIZES="${SIZES:-2:64:2 4:128:4 4:256:8}"
RANKS="${RANKS:-1 2}"
STEPS="${STEPS:-12}"
REPEATS="${REPEATS:-1}"
BATCH="${BATCH:-16}"
SEQ=128
WORK="${WORK:-$(mktemp -d /tmp/atoll_plan_self.XXXXXX)}"
mkdir -p "$WORK"
export ATOLL_PLAN_CALIBRATION="${ATOLL_PLAN_CALIBRATION:-$WORK/calibration.json}"
PY=/usr/bin/python3
cd "$ROOT"
export OMP_NUM_THREADS=1
if [[ $CALIBRATE == 1 ]]; then "$BIN" plan calibrate --out "$ATOLL_PLAN_CALIBRATION" >&2; fi
CAL2="$WORK/calibration_2cores.json"
# The 2-rank device is both cores at once. What each core has to itself (its arithmetic: the GEMM
# curve, attention, the optimizer's rate) is the one-core figure twice; what the two ranks share
# (L3 and the memory bandwidth: ~27-32 GB/s on two cores against ~23 on one, not 46) is measured
# by a second calibration with two threads. (A two-thread GEMM curve would be wrong here: each
# rank runs one-thread GEMMs, which small shapes do far better than one GEMM split over two
# threads.) Two threads are timed by the wall clock: run this on a quiet machine. With
# --no-calibrate, ATOLL_PLAN_CALIBRATION_2CORES names the two-thread file; without it the
# one-core bandwidths are doubled too (which ignores the sharing and under-predicts the 2-rank
# runs of the larger models).
CAL2T="${ATOLL_PLAN_CALIBRATION_2CORES:-$WORK/calibration_2threads.json}"
if [[ $CALIBRATE == 1 ]]; then OMP_NUM_THREADS=2 "$BIN" plan calibrate --no-collectives --out "$CAL2T" >&2; fi
$PY -c 'import json,sys,os; j=json.load(open(sys.argv[1]))
for k in ("peak_fp32_flops","peak_bf16_flops","memory_bandwidth","elementwise_bandwidth","attention_flops","optimizer_params_per_s"):
  if k in j: j[k]*=2
for p in j.get("attention_curve",[]): p[1]*=2
if os.path.exists(sys.argv[3]):
  t=json.load(open(sys.argv[3]))
  for k in ("memory_bandwidth","elementwise_bandwidth"): j[k]=t[k]
j["threads"]=2; json.dump(j,open(sys.argv[2],"w"),indent=1)' "$ATOLL_PLAN_CALIBRATION" "$CAL2" "$CAL2T"

median_ms() {  # median step_ms over metrics.jsonl files, skipping each run's first 2 steps
  $PY -c 'import sys,statistics as s; sys.path.insert(0, "tools"); from metrics_jsonl import records
v=[x for f in sys.argv[1:] for x in [r["step_ms"] for r in records(f)][2:]]
print("%.1f" % s.median(v))' "$@"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"
echo "| layers | n_embd | heads | params | ranks | tokens/step | wall ms (median) | cpu ms/step | predicted ms | error vs cpu | error vs wall |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for size in $SIZES; do
  IFS=: read -r L C H <<<"$size"
  cfg="$WORK/model_${L}_${C}.toml"
  printf '[model]\npreset = "gpt2"\nvocab_size = 257\nblock_size = %d\nn_layer = %d\nn_head = %d\nn_embd = %d\n[train]\nseq_len = %d\n' \
    $SEQ "$L" "$H" "$C" $SEQ >"$cfg"
  for n in $RANKS; do
    cpus=() walls=()
    for rep in $(seq "$REPEATS"); do
      cpu=()
      for steps in "$STEPS" $((STEPS / 3)); do
        run="$WORK/run_${L}_${C}_${n}_${steps}_$rep"
        rm -rf "$run"
        args=(train configs/default.toml --run.dir="$run" --train.steps="$steps" --train.batch_size="$BATCH"
              --train.seq_len=$SEQ --eval.every=0 --sample.every=0 --checkpoint.every=0 --log.every=100
              --model.n_layer="$L" --model.n_embd="$C" --model.n_head="$H")
        if [[ $n == 1 ]]; then cmd=("$BIN" "${args[@]}")
        else cmd=("$BIN" launch --nproc-per-node "$n" -- "$BIN" "${args[@]}"); fi
        /usr/bin/time -f "%U %S" -o "$run.time" "${cmd[@]}" >"$run.log" 2>&1
        cpu+=("$(awk '{print $1 + $2}' "$run.time")")
        [[ $steps == "$STEPS" ]] && walls+=("$run/metrics.jsonl")
      done
      cpus+=("$($PY -c "print(1e3 * (${cpu[0]} - ${cpu[1]}) / ($STEPS - $STEPS // 3) / $n)")")
    done
    wall=$(median_ms "${walls[@]}")
    cpums=$($PY -c 'import sys,statistics as s; print("%.1f" % s.median(map(float, sys.argv[1:])))' "${cpus[@]}")
    calf="$ATOLL_PLAN_CALIBRATION"; [[ $n == 2 ]] && calf="$CAL2"
    # The all-reduce is counted as exposed: atoll DDP overlaps it with backward, but each rank has
    # one core, so Gloo's copies and sums take time from that core either way.
    pj=$(ATOLL_PLAN_CALIBRATION="$calf" "$BIN" plan --from-atoll "$cfg" --device cpu-local --devices-per-node "$n" --set plan.overlap_dp=false \
         --set plan.precision='"fp32"' --set plan.micro_batch="$BATCH" --set plan.global_batch=$((BATCH * n)) --json)
    read -r params pred < <($PY -c 'import json,sys; j=json.load(sys.stdin); print(j["model"]["params"], "%.1f" % (1e3*j["time"]["step_s"]))' <<<"$pj")
    errs=$($PY -c "print('%+.1f%% | %+.1f%%' % (100*($pred-$cpums)/$cpums, 100*($pred-$wall)/$wall))")
    echo "| $L | $C | $H | $params | $n | $((BATCH * SEQ * n)) | $wall | $cpums | $pred | $errs |"
  done
done
