#!/usr/bin/env bash
# DeadPool (issue 14 item 2; docs/fault_tolerance.md): what the in-memory peer snapshots cost a
# failure-free step, and how fast a spare takes a killed replica's place.
#  1. the snapshot machinery alone (test_resilience --dp-bench): a step that reads STATE_MB of state
#     3 times and rewrites it once, snapshots off and on (every step, every 10), the holder in
#     another process;
#  2. `atoll train` in quorum mode, RANKS replicas of a tiny GPT: median step time with
#     [fault] snapshot_every = 0 and 1, two runs each, alternated;
#  3. kill -9 of replica 1 with one spare in the pool: the survivors' next commit (at full size).
# No PyTorch peer: torchft has no spare pool and is not a Debian package.
# Usage: bench/deadpool.sh [BUILD_DIR]   (env: RANKS=3 STEPS=200 STATE_MB=64 PARTS="1 2 3")
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
T=$(realpath "$BUILD/tests/resilience/test_resilience")
RANKS=${RANKS:-3}
STEPS=${STEPS:-200}
STATE_MB=${STATE_MB:-64}
PARTS=${PARTS:-1 2 3}
part() { [[ " $PARTS " == *" $1 "* ]]; }
W=$(mktemp -d /tmp/atoll_dpbench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"

if part 1; then
  echo "== 1. snapshot machinery, $STATE_MB MB of state =="
  "$T" --dp-bench "$STATE_MB" 80 3 1
  "$T" --dp-bench "$STATE_MB" 80 3 10
fi

. "$(dirname "$0")/ft_job.sh"
ft_job_write 0

median_ms() {  # median step_ms of a metrics.jsonl, the first 10 steps left out (warm-up)
  python3 -c '
import json, statistics, sys
v = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "step_ms" in l]
print("%.2f" % statistics.median(v[10:]))' "$1"
}
start_lighthouse() {  # extra args
  "$A" lighthouse --host 127.0.0.1 --port 0 --min-replicas "$RANKS" "$@" > "$W/lh.log" 2>&1 &
  LH=$!
  for _ in $(seq 100); do grep -q listening "$W/lh.log" && break; sleep 0.05; done
  LH_PORT=$(sed -n 's/.*127.0.0.1:\([0-9]*\) .*/\1/p' "$W/lh.log")
}
replica() {  # rank, run name, extra args
  local r=$1 name=$2; shift 2
  RANK=$r WORLD_SIZE=$RANKS ATOLL_LIGHTHOUSE=127.0.0.1:$LH_PORT OMP_NUM_THREADS=1 \
    "$A" train "$W/cfg.toml" --run.dir="$W/$name" --fault.tolerance=quorum "$@" >> "$W/$name.r$r.log" 2>&1
}
run_quorum() {  # name, extra args
  local name=$1; shift
  start_lighthouse
  local ps=()
  for r in $(seq 0 $((RANKS - 1))); do replica "$r" "$name" "$@" & ps+=($!); done
  wait "${ps[@]}" || true
  kill $LH 2>/dev/null || true
  median_ms "$W/$name/replica0/metrics.jsonl"
}

steps_in() {  # step records in a metrics.jsonl so far (0 while it does not exist)
  local n
  n=$(grep -c '"step"' "$1" 2>/dev/null || true)
  echo "${n:-0}"
}

part 2 && echo "== 2. quorum mode, $RANKS replicas, $STEPS steps, tiny GPT: median step time =="
for k in 1 2; do
  part 2 || break
  off=$(run_quorum off$k --fault.snapshot_every=0)
  on=$(run_quorum on$k --fault.snapshot_every=1)
  python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('  run %s: snapshots off %.2f ms, every step %.2f ms (x%.3f)' % ('$k', a, b, b/a))" "$off" "$on"
done

part 3 || exit 0
echo "== 3. kill -9 of replica 1 at step $((STEPS / 2)), one spare waiting =="
start_lighthouse --slots "$RANKS"
pids=()
for r in $(seq 0 $((RANKS - 1))); do replica "$r" swap --fault.snapshot_every=1 & pids+=($!); done
RANK=0 ATOLL_SPARE_ID=100 WORLD_SIZE=$RANKS ATOLL_LIGHTHOUSE=127.0.0.1:$LH_PORT OMP_NUM_THREADS=1 \
  "$A" train "$W/cfg.toml" --run.dir="$W/swap" --fault.tolerance=quorum --fault.snapshot_every=1 --fault.spare=true \
  > "$W/swap.spare.log" 2>&1 &
SP=$!
until [ "$(steps_in "$W/swap/replica0/metrics.jsonl")" -ge $((STEPS / 2)) ]; do sleep 0.01; done
pkill -9 -P "${pids[1]}" 2>/dev/null || true
kill -9 "${pids[1]}" 2>/dev/null || true
t_kill=$(date +%s%3N)
sleep 3  # the survivors' next commit is logged within this
# The first commit after a failure whose wall clock is past the kill (an earlier one can be start-up).
line=$(grep "after the failure was noticed" "$W/swap.r0.log" | while read -r l; do
  t=$(sed -n 's/.*wall clock \([0-9]*\) ms.*/\1/p' <<< "$l"); [ "$t" -ge "$t_kill" ] && { echo "$l"; break; }; done)
t_commit=$(sed -n 's/.*wall clock \([0-9]*\) ms.*/\1/p' <<< "$line")
members=$(sed -n 's/.*committed on quorum [0-9]* (\([0-9]*\) members).*/\1/p' <<< "$line")
wait "${pids[0]}" "${pids[2]}" "$SP" || true
kill $LH 2>/dev/null || true
echo "  hot swap: next commit $((t_commit - t_kill)) ms after the kill, on $members of $RANKS members"
grep -h "restored from its peer" "$W/swap.spare.log" | sed 's/^/  /' || echo "  (the spare restored no snapshot)"
