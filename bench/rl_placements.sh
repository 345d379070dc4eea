#!/usr/bin/env bash
# RL placements on GRPO / 2-digit addition (configs/rl_add.toml): colocated vs async
# (one-step-off-policy) on 1 and 2 ranks, and disaggregated on 3 ranks (2 trainers + 1 rollout
# rank; on policy "dis0" and one step off "dis1"). For each: medians over the RL steps of the time split
# (generate, score, train, sync; async: the wait for the rollout thread), the step time and the
# end-to-end samples/s; for async, whether step <= max(generate, train) + sync (the overlap).
# Disaggregated: sync = trainer 0's weight broadcast; wait = waiting for the push and the rollouts;
# samples/s counts the trainers' batches.
# usage: bench/rl_placements.sh [RL_STEPS] [PROMPTS] [GROUP]    (build: --target atoll)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30} P=${2:-16} G=${3:-8}
ATOLL=${BUILD:-build}/atoll
[ -x "$ATOLL" ] || { echo "build first: cmake --build build --target atoll"; exit 1; }
out=$(mktemp -d)
run() {  # placement ranks [staleness]
  local dir="$out/$1${3:-}_$2"
  local extra=()
  [ -n "${3:-}" ] && extra=(--rl.max_staleness=$3)
  local args=(configs/rl_add.toml --train.steps=$((STEPS + 5)) --rl.sft_steps=5 --rl.placement=$1 "${extra[@]}"
        --rl.prompts=$P --rl.group_size=$G --eval.every=0 --sample.every=0 --log.every=1000 --run.dir="$dir"
        --hardware.peak_gflops=1 --train.threads=1)
  if [ "$2" = 1 ]; then "$ATOLL" train "${args[@]}" > "$dir.log" 2>&1
  else "$ATOLL" launch --nproc-per-node "$2" -- "$ATOLL" train "${args[@]}" > "$dir.log" 2>&1; fi
  echo "$1${3:-} $2 $dir/metrics.jsonl"
}
runs=$(for r in 1 2; do for p in colocated async; do run $p $r; done; done; run disaggregated 3 0; run disaggregated 3 1)
/usr/bin/python3 - "$P" "$G" <<PY
import json, statistics as st, sys
P, G = int(sys.argv[1]), int(sys.argv[2])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu} (shared, loaded); GRPO, {P} prompts x {G} rollouts per rank per step; medians over RL steps 3..")
print(f"{'placement':<11}{'ranks':>6}{'gen ms':>8}{'score ms':>9}{'train ms':>9}{'sync ms':>8}{'wait ms':>8}{'step ms':>8}{'samples/s':>10}  overlap")
for line in """$runs""".splitlines():
    pl, ranks, path = line.split()
    recs = [json.loads(l) for l in open(path) if '"phase":"rl"' in l.replace(" ", "")][2:]
    med = lambda k: st.median(r.get(k, 0.0) for r in recs)
    step = med("step_ms")
    dis = pl.startswith("disaggregated")
    sps = P * G * (int(ranks) - 1 if dis else int(ranks)) / (step / 1e3)
    wait = med("push_wait_ms") + med("exchange_ms") if dis else med("wait_ms")
    pl = pl.replace("disaggregated", "dis")
    ok = ""
    if pl == "async":
        # 5%: the main thread still prepares advantages and statistics between the two
        ok = "yes" if step <= 1.05 * (max(med("gen_ms") + med("score_ms"), med("train_ms")) + med("sync_ms")) else "no"
    print(f"{pl:<11}{ranks:>6}{med('gen_ms'):8.0f}{med('score_ms'):9.0f}{med('train_ms'):9.0f}{med('sync_ms'):8.2f}{wait:8.0f}{step:8.0f}{sps:10.0f}  {ok}")
PY
rm -rf "$out"
