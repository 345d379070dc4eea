#!/usr/bin/env bash
# Tensor parallelism: a GPT training step split over 2 ranks (tp = 2, with and without sequence
# parallelism) vs the whole model on one rank, same global batch, one thread per rank, in one run
# on this machine: the step-time ratio (tp2 / one rank; < 1: tp2 faster) and the share of the tp
# communication hidden behind compute (1 - time blocked in the collectives / the same collectives
# run alone). Medians over STEPS steps (REPEATS runs). No PyTorch peer: torch 1.13 (Debian's) has
# no tensor-parallel API (torch.distributed.tensor.parallel came with 2.0).
# usage: bench/tp_vs_one.sh [N_LAYER N_EMBD N_HEAD B T STEPS REPEATS]
# (build first: cmake --build build --target atoll bench_tp)
set -euo pipefail
cd "$(dirname "$0")/.."
L=${1:-4} C=${2:-512} H=${3:-8} B=${4:-4} T=${5:-128} STEPS=${6:-8} REPEATS=${7:-3}
BUILD=${BUILD:-build}
ATOLL=$BUILD/atoll
BENCH=$BUILD/bench/bench_tp
[ -x "$BENCH" ] && [ -x "$ATOLL" ] || { echo "build first: cmake --build $BUILD --target atoll bench_tp"; exit 1; }
args="$L $C $H $B $T $STEPS"
rank0() { sed -n 's/^\[rank 0\] //p; /^{/p' | grep '^{' | tail -1; }
runs=()
for r in $(seq "$REPEATS"); do
  runs+=("$(OMP_NUM_THREADS=1 "$BENCH" $args 1 1)")
  runs+=("$("$ATOLL" launch --nproc-per-node 2 -- "$BENCH" $args 1 1 | rank0)")
  runs+=("$("$ATOLL" launch --nproc-per-node 2 -- "$BENCH" $args 0 1 | rank0)")
done
/usr/bin/python3 - "$L" "$C" "$H" "$B" "$T" "${runs[@]}" <<'PY'
import json, statistics as st, sys, platform
L, C, H, B, T = sys.argv[1:6]
rs = [json.loads(a) for a in sys.argv[6:]]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
with open("/proc/loadavg") as f: load = f.read().split()[0]
print(f"CPU: {cpu}; load average {load} (a shared machine: figures under load)")
print(f"GPT L{L} C{C} H{H}, global batch ({B},{T}), 1 thread per rank, medians of {len(rs)//3} runs")
one = [r for r in rs if r["tp"] == 1]
sp = [r for r in rs if r["tp"] == 2 and r["sequence_parallel"]]
nosp = [r for r in rs if r["tp"] == 2 and not r["sequence_parallel"]]
m = lambda xs, k: st.median(x[k] for x in xs)
t1 = m(one, "step_s")
print(f"{'run':<26}{'step ms':>9}{'ratio':>8}{'wait ms':>9}{'(other)':>9}{'alone ms':>10}{'hidden':>8}"
      f"{'  | overlappable: wait ms':>24}{'alone ms':>10}{'hidden':>8}")
print(f"{'one rank':<26}{1e3*t1:9.1f}{1.0:8.2f}")
for name, xs in [("tp2, sequence parallel", sp), ("tp2, all-reduce (no SP)", nosp)]:
    print(f"{name:<26}{1e3*m(xs,'step_s'):9.1f}{m(xs,'step_s')/t1:8.2f}{1e3*m(xs,'comm_wait_s'):9.1f}"
          f"{1e3*m(xs,'comm_wait_max_rank_s'):9.1f}"
          f"{1e3*m(xs,'comm_alone_s'):10.1f}{100*m(xs,'hidden_share'):7.0f}%"
          f"{1e3*m(xs,'overlappable_wait_s'):24.1f}{1e3*m(xs,'overlappable_alone_s'):10.1f}"
          f"{100*m(xs,'overlappable_hidden_share'):7.0f}%")
print("wait: blocked in the tp collectives per step (the smaller rank's, median step; (other): the rank "
      "that waits more, which includes waiting for the other rank to arrive); alone: the same "
      "collectives replayed one by one; hidden = 1 - wait/alone; overlappable: only the collectives with "
      "compute beside them (SP gathers before the GEMMs, backward reductions beside dW)")
PY
