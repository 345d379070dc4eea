#!/usr/bin/env bash
# atoll plan's step time vs atoll's measured step time for model-parallel layouts on this machine
# (issue 11, item 8; issue 16, item 4): one rank, tp2, pp2 (1f1b, m=4), cp2, dp2, DiLoCo over 2 islands, and an
# MoE (configs/moe-small.toml's experts on the same attention sizes) on one rank and with ep2 (dp_shard=2, ep=2,
# i.e. ZeRO-3 with the experts split over the two ranks), each trained for STEPS steps
# with `atoll launch` (one thread per rank) on the bundled corpus; measured = median step_ms of
# metrics.jsonl without the first step, and CPU ms per step and rank (see below); predicted = `atoll plan --from-atoll` with the same model,
# batch and layout on `cpu-local`. No PyTorch peer: the planner is compared with the engine.
# cpu-local comes from `atoll plan calibrate --quick` (one thread, CPU time; the loopback
# all-reduce bandwidth and latency fitted from `atoll bench comm` over Gloo/TCP on 127.0.0.1, by
# CPU time too since session 7, the wall-clock fit printed beside it; ring attention's block
# kernels timed for the cp rows), or
# from $ATOLL_PLAN_CALIBRATION when it exists. The 2-rank device doubles the per-core rates of the
# 1-thread calibration (each rank has its own core) and keeps its memory bandwidth (the two ranks
# share L3 and DRAM). The element-wise kernels' rate is doubled too, as tools/plan_self_check.sh
# does: at ~5 GB/s against the triad's ~15-23 GB/s on one core they are bound by the core's
# arithmetic (exp, rsqrt, GELU's tanh), not by the DRAM the ranks share.
# DiLoCo (2 islands of 1 rank, H = 4): the plan's islands are 1-core devices (the 1-thread
# calibration) joined by the loopback link that calibration measured (its intra-node all-reduce
# fit), given as the inter-island link.
# Prints predicted/wall and predicted/CPU per layout, whether the machine was loaded, and the
# prediction per phase (time.* of --json) to set beside a perf profile. One command, 3-5 minutes
# under load with its calibration.
# usage: bench/plan_vs_measured_mp.sh [N_LAYER N_EMBD N_HEAD BATCH SEQ STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
L=${1:-2} C=${2:-128} H=${3:-4} B=${4:-8} T=${5:-128} STEPS=${6:-12}
BUILD=${BUILD:-build}
BIN=$BUILD/atoll
[ -x "$BIN" ] || { echo "build first: cmake --build $BUILD --target atoll"; exit 1; }
PY=/usr/bin/python3
WORK=${WORK:-$(mktemp -d /tmp/atoll_plan_mp.XXXXXX)}
mkdir -p "$WORK"
export OMP_NUM_THREADS=1
CAL1=${ATOLL_PLAN_CALIBRATION:-$WORK/calibration.json}
[ -f "$CAL1" ] || "$BIN" plan calibrate --quick --out "$CAL1" >"$WORK/calibrate.log" 2>&1
CAL2=$WORK/calibration_2ranks.json
# The two ranks share DRAM: on a quiet machine (load average < 2) a two-thread triad
# (`OMP_NUM_THREADS=2 atoll plan calibrate --quick --no-collectives`, timed by the wall clock, as
# tools/plan_self_check.sh does) gives the machine's memory bandwidth for two ranks, which the
# 2-rank device splits between them. Under load two threads cannot be timed (the wall clock counts
# the other processes), so the one-thread triad stays, halved per rank (an under-estimate where a
# rank's traffic stays in its own core's caches: docs/plan.md, "Per phase").
CAL2T=${ATOLL_PLAN_CALIBRATION_2THREADS:-$WORK/calibration_2threads.json}
if [[ ! -f $CAL2T ]] && awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN{exit !(l < 2)}'; then
  OMP_NUM_THREADS=2 "$BIN" plan calibrate --quick --no-collectives --out "$CAL2T" >"$WORK/calibrate_2threads.log" 2>&1
fi
$PY -c 'import json,sys,os; j=json.load(open(sys.argv[1]))
for k in ("peak_fp32_flops","peak_bf16_flops","attention_flops","optimizer_params_per_s","elementwise_bandwidth"):
  if k in j: j[k]*=2
for c in ("attention_curve","ring_attention_curve"):
  for p in j.get(c,[]): p[1]*=2
if os.path.exists(sys.argv[3]): j["memory_bandwidth"]=json.load(open(sys.argv[3]))["memory_bandwidth"]
j["threads"]=2; json.dump(j,open(sys.argv[2],"w"),indent=1)' "$CAL1" "$CAL2" "$CAL2T"
load0=$(cut -d' ' -f1-3 /proc/loadavg)

WAN=$($PY -c 'import json,sys; j=json.load(open(sys.argv[1]))
print("--set cluster.inter_island.bandwidth_gbs=%g --set cluster.inter_island.latency_ms=%g" % (j["intra_node_bandwidth"]/1e9, 1e3*j["intra_node_latency"]))' "$CAL1")

cfg=$WORK/model.toml
printf '[model]\npreset = "gpt2"\nvocab_size = 257\nblock_size = %d\nn_layer = %d\nn_head = %d\nn_embd = %d\n[train]\nseq_len = %d\n' \
  "$T" "$L" "$H" "$C" "$T" >"$cfg"
# The MoE rows: moe-small's experts (16 routed of 64 units, top 2, 2 shared; the first layer dense)
# on the same depth, width and heads; the same [model] keys go to the trainer and to the planner.
moecfg=$WORK/moe.toml
printf '[model]\nfamily = "moe"\npreset = "moe-small"\nvocab_size = 257\nblock_size = %d\nn_layer = %d\nn_head = %d\nn_embd = %d\n[train]\nseq_len = %d\n' \
  "$T" "$L" "$H" "$C" "$T" >"$moecfg"

# name | ranks | train flags | plan flags | model (gpt: configs/default.toml; moe: configs/moe-small.toml)
layouts=(
  "1 rank|1||"
  "tp2 (sp)|2|--parallel.tp=2|--set plan.tp=2 --set plan.sp=true"
  "pp2 1f1b m=4|2|--parallel.pp=2 --parallel.pp_schedule=1f1b --train.grad_accum=4|--set plan.pp=2 --set plan.schedule=\"1f1b\" --set plan.global_batch=$((4 * B))"
  "cp2|2|--parallel.cp=2|--set plan.cp=2"
  "dp2 (ddp)|2||--set plan.dp=2 --set plan.global_batch=$((2 * B))"
  "diloco 2 islands H=4|2|--parallel.islands=2 --lowcomm.inner_steps=4|--islands 2 --set plan.dp=2 --set plan.diloco_h=4 --set plan.global_batch=$((2 * B)) $WAN"
  "moe 1 rank|1|||moe"
  "moe ep2 (zero3)|2|--parallel.dp_shard=2 --parallel.ep=2|--set plan.dp=2 --set plan.ep=2 --set plan.zero=3 --set plan.global_batch=$((2 * B))|moe"
)
# ONLY (an extended regex, optional): run just the layouts whose name matches it, e.g.
# ONLY='^(1 rank|tp2|moe ep2)' for the rows a change can move.
if [[ -n ${ONLY:-} ]]; then
  kept=()
  for spec in "${layouts[@]}"; do [[ ${spec%%|*} =~ $ONLY ]] && kept+=("$spec"); done
  layouts=("${kept[@]}")
fi
median_ms() {
  $PY -c 'import sys,statistics as s; sys.path.insert(0, "tools"); from metrics_jsonl import records
v=[r["step_ms"] for r in records(sys.argv[1])][1:]
print("%.1f" % s.median(v))' "$1"
}
rows=()
for spec in "${layouts[@]}"; do
  IFS='|' read -r name n tflags pflags kind <<<"$spec"
  tcfg=configs/default.toml pcfg=$cfg
  [[ $kind == moe ]] && tcfg=configs/moe-small.toml pcfg=$moecfg
  # Two runs, STEPS and 2 steps: CPU seconds of the process tree per step and rank, start-up
  # cancelling out. On a loaded machine the wall clock counts the time other processes hold the
  # cores; CPU time is what the step costs while it has them (what the plan and its calibration
  # measure), though it leaves out a rank's sleep while it waits for its peer.
  cpu=()
  for steps in "$STEPS" 2; do
    run=$WORK/run_${name//[^a-z0-9]/_}_$steps
    rm -rf "$run"
    args=(train "$tcfg" --run.dir="$run" --train.steps="$steps" --train.batch_size="$B" --train.seq_len="$T"
          --eval.every=0 --sample.every=0 --checkpoint.every=0 --log.every=100
          --model.n_layer="$L" --model.n_embd="$C" --model.n_head="$H" $tflags)
    if [[ $n == 1 ]]; then cmd=("$BIN" "${args[@]}"); else cmd=("$BIN" launch --nproc-per-node "$n" -- "$BIN" "${args[@]}"); fi
    /usr/bin/time -f "%U %S" -o "$run.time" "${cmd[@]}" >"$run.log" 2>&1
    cpu+=("$(awk '{print $1 + $2}' "$run.time")")
  done
  run=$WORK/run_${name//[^a-z0-9]/_}_$STEPS
  cpums=$($PY -c "print('%.1f' % (1e3 * (${cpu[0]} - ${cpu[1]}) / ($STEPS - 2) / $n))")
  meas=$(median_ms "$run/metrics.jsonl")
  calf=$CAL1; [[ $n == 2 && $pflags != *--islands* ]] && calf=$CAL2
  # $pflags is split on blanks on purpose; its quotes stay (TOML strings).
  # shellcheck disable=SC2086
  dpn=$n; [[ $pflags == *--islands* ]] && dpn=1
  pj=$(ATOLL_PLAN_CALIBRATION="$calf" "$BIN" plan --from-atoll "$pcfg" --device cpu-local --devices-per-node "$dpn" \
       --set plan.precision='"fp32"' --set plan.micro_batch="$B" --set plan.overlap_dp=false $pflags --json)
  # Kept for the per-phase comparison (time.* of --explain; docs/plan.md, "Per phase").
  echo "$pj" >"$run.plan.json"
  pred=$($PY -c 'import json,sys; print("%.1f" % (1e3*json.load(sys.stdin)["time"]["step_s"]))' <<<"$pj")
  # A pipeline stage waiting out its bubble sleeps in a receive, and a rank in a blocking
  # collective sleeps until its peer has sent (time.sync_wait: the calibration's wall-clock fit of
  # the all-reduces less its CPU-time fit): CPU time counts neither.
  prednb=$($PY -c 'import json,sys; t=json.load(sys.stdin)["time"]; print("%.1f" % (1e3*(t["step_s"]-t["bubble_s"]-t.get("sync_wait_s",0))))' <<<"$pj")
  rows+=("$name|$meas|$cpums|$pred|$prednb")
done
cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "GPT L$L C$C H$H, batch $B x $T per micro-batch, $STEPS steps (median of steps 2..$STEPS), 1 thread per rank"
echo "CPU: $cpu ($(getconf _NPROCESSORS_ONLN) cores); load average $load0 at start, $load1 at end"
cal_note=$($PY -c 'import json,sys; j=json.load(open(sys.argv[1]))
print("calibration: peak %.0f GFLOP/s, loopback all-reduce %.2f GB/s + %.1f us per step (%s; wall clock %.2f GB/s + %.1f us)" % (
  j["peak_fp32_flops"]/1e9, j["intra_node_bandwidth"]/1e9, 1e6*j["intra_node_latency"], j.get("collective_timing","wall clock"),
  j.get("intra_node_wall_bandwidth", j["intra_node_bandwidth"])/1e9, 1e6*j.get("intra_node_wall_latency", j["intra_node_latency"])))' "$CAL1")
echo "$cal_note"
if [[ -f $CAL2T ]]; then echo "2-rank memory bandwidth: two-thread triad $($PY -c 'import json,sys; print("%.2f GB/s" % (json.load(open(sys.argv[1]))["memory_bandwidth"]/1e9))' "$CAL2T") (split between the ranks)"
else echo "2-rank memory bandwidth: the one-thread triad, split between the ranks (no two-thread calibration: under load)"; fi
echo "| layout | measured wall ms | measured CPU ms/step/rank | predicted ms | predicted/wall | predicted/CPU | predicted without bubble and waits/CPU | CPU | load average |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r name meas cpums pred prednb <<<"$r"
  echo "| $name | $meas | $cpums | $pred | $($PY -c "print('%.2f' % ($pred/$meas))") | $($PY -c "print('%.2f' % ($pred/$cpums))") | $($PY -c "print('%.2f' % ($prednb/$cpums))") | $cpu | $load1 |"
done
if awk -v l="${load0%% *}" 'BEGIN{exit !(l > 1.5)}'; then
  echo "UNDER LOAD (load average ${load0%% *} at start on $(getconf _NPROCESSORS_ONLN) cores): the wall clock counts other processes' time slices; compare predicted/CPU"
else
  echo "quiet machine (load average ${load0%% *} at start): predicted/wall decides the 20% bound"
fi
echo "(work dir: $WORK)"
# The prediction per phase (ms per step; time.* of `atoll plan --json`), to set beside a perf profile
# of the same run (docs/plan.md, "Per phase").
echo "| layout | compute | memory-bound | grad buffers | ep copies | optimizer | bubble | tp | cp | ep | pp p2p | dp | control (step collectives) | waits in collectives | of which compute between (gap_wait) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for spec in "${layouts[@]}"; do
  IFS='|' read -r name _ <<<"$spec"
  $PY -c 'import json,sys; t=json.load(open(sys.argv[2]))["time"]
f=lambda k: "%.1f" % (1e3*(t[k]["total_s"] if isinstance(t[k], dict) else t.get(k, 0)))
print("| %s | %s |" % (sys.argv[1], " | ".join(f(k) for k in ("compute_s","memory_bound_s","grad_buffers_s","ep_copies_s","optimizer_s","bubble_s","tp","cp","ep","pp_p2p","dp","control","sync_wait_s","gap_wait_s"))))' \
    "$name" "$WORK/run_${name//[^a-z0-9]/_}_$STEPS.plan.json"
done
