#!/usr/bin/env bash
# Fault tolerance against plain DDP on one machine (issue 14; docs/fault_tolerance.md):
#  1. failure-free median step time: DDP without guards, DDP with the phase fingerprints (the
#     default), DDP with per-step signatures, and quorum mode (lighthouse, heartbeats, commit vote);
#  2. recovery after kill -9 of one rank: quorum mode (the survivors' next commit) against
#     restarting the whole job from its last disk checkpoint (`atoll launch` tears the job down on a
#     death; the relaunch resumes; time to its first step, plus the steps redone).
# There is no PyTorch peer here: torchft is not a Debian package; the baseline is atoll's own DDP.
# Usage: bench/ft_vs_ddp.sh [BUILD_DIR]   (env: RANKS=3 STEPS=200)
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
RANKS=${RANKS:-3}
STEPS=${STEPS:-200}
W=$(mktemp -d /tmp/atoll_ftbench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"

. "$(dirname "$0")/ft_job.sh"
ft_job_write 50

steps_in() {  # step records in a metrics.jsonl so far (0 while it does not exist)
  local n
  n=$(grep -c '"step"' "$1" 2>/dev/null || true)
  echo "${n:-0}"
}

median_ms() {  # median step_ms of a metrics.jsonl, the first 10 steps left out (warm-up)
  python3 -c '
import json, statistics, sys
v = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "step_ms" in l]
print("%.2f" % statistics.median(v[10:]))' "$1"
}

run_ddp() {  # name, extra args
  local name=$1; shift
  "$A" launch --nproc-per-node "$RANKS" --timeout 60 -- "$A" train "$W/cfg.toml" --run.dir="$W/$name" "$@" > "$W/$name.log" 2>&1
  median_ms "$W/$name/metrics.jsonl"
}

start_lighthouse() {
  "$A" lighthouse --host 127.0.0.1 --port 0 --min-replicas "$RANKS" > "$W/lh.log" 2>&1 &
  LH=$!
  for _ in $(seq 100); do grep -q listening "$W/lh.log" && break; sleep 0.05; done
  LH_PORT=$(sed -n 's/.*127.0.0.1:\([0-9]*\) .*/\1/p' "$W/lh.log")
}

replica() {  # rank, run name, extra args
  local r=$1 name=$2; shift 2
  RANK=$r WORLD_SIZE=$RANKS ATOLL_LIGHTHOUSE=127.0.0.1:$LH_PORT OMP_NUM_THREADS=1 \
    "$A" train "$W/cfg.toml" --run.dir="$W/$name" --fault.tolerance=quorum "$@" >> "$W/$name.r$r.log" 2>&1
}

echo "== failure-free median step time, $RANKS ranks, $STEPS steps, tiny GPT (under load: figures move by 10-20%) =="
base=$(run_ddp ddp_plain --fault.phase_guard=false --fault.gate=false)
guard=$(run_ddp ddp_guard)
sig=$(run_ddp ddp_sig --fault.signatures=true)
start_lighthouse
for r in $(seq 0 $((RANKS - 1))); do replica "$r" quorum & done
wait $(jobs -p | grep -v "^$LH$") 2>/dev/null || true
kill $LH 2>/dev/null || true
quorum=$(median_ms "$W/quorum/replica0/metrics.jsonl")
python3 - "$base" "$guard" "$sig" "$quorum" <<'PY'
import sys
b, g, s, q = map(float, sys.argv[1:])
for name, v in [("DDP (no gate, no fingerprints)", b), ("DDP + phase fingerprints (default)", g),
                ("DDP + signatures", s), ("quorum mode (heartbeats, quorum, commit vote)", q)]:
    print("  %-48s %8.2f ms  x%.3f" % (name, v, v / b))
PY

KILL_AT=$((STEPS / 2 + 25))  # mid-way between two checkpoints (every 50)
echo "== recovery after kill -9 of rank 1 at about step $KILL_AT =="
# Quorum mode: the survivors' first commit after the kill.
start_lighthouse
pids=()
for r in $(seq 0 $((RANKS - 1))); do replica "$r" qkill & pids+=($!); done
while [ "$(steps_in "$W/qkill/replica0/metrics.jsonl")" -lt $KILL_AT ]; do sleep 0.01; done
pkill -9 -P "${pids[1]}" 2>/dev/null || true
kill -9 "${pids[1]}" 2>/dev/null || true
t_kill=$(date +%s%3N)
for _ in $(seq 500); do grep -q "after the failure was noticed" "$W/qkill.r0.log" && break; sleep 0.01; done
t_commit=$(sed -n 's/.*wall clock \([0-9]*\) ms.*/\1/p' "$W/qkill.r0.log" | head -1)
replica 1 qkill --resume &
wait "${pids[0]}" || true
kill $LH 2>/dev/null || true
echo "  quorum mode: survivors committed the next step $((t_commit - t_kill)) ms after the kill (no step redone by them)"

# Restart from disk: the launcher tears the job down; relaunch with --resume.
"$A" launch --nproc-per-node "$RANKS" --timeout 60 -- "$A" train "$W/cfg.toml" --run.dir="$W/dkill" > "$W/dkill.log" 2>&1 &
LP=$!
while [ "$(steps_in "$W/dkill/metrics.jsonl")" -lt $KILL_AT ]; do sleep 0.01; done
killed_at_step=$(steps_in "$W/dkill/metrics.jsonl")
victim=$(pgrep -f -- "--run.dir=$W/dkill" | while read -r p; do [ "$(ps -o ppid= -p "$p" | tr -d ' ')" = "$LP" ] && echo "$p"; done | sed -n 2p)
kill -9 "$victim"
t_kill=$(date +%s%3N)
wait $LP || true
lines=$(wc -l < "$W/dkill/metrics.jsonl")
"$A" launch --nproc-per-node "$RANKS" --timeout 60 -- "$A" train "$W/cfg.toml" --run.dir="$W/dkill" --resume > "$W/dkill2.log" 2>&1 &
LP2=$!
while [ "$(wc -l < "$W/dkill/metrics.jsonl")" -le $((lines + 1)) ]; do sleep 0.01; done
t_first=$(date +%s%3N)
last_ckpt=$(( (killed_at_step / 50) * 50 ))
# Back where it was: the relaunch has redone the steps since the checkpoint.
while [ "$(wc -l < "$W/dkill/metrics.jsonl")" -le $((lines + 1 + killed_at_step - last_ckpt)) ]; do sleep 0.01; done
t_back=$(date +%s%3N)
wait $LP2 || true
echo "  restart from disk: first step after the relaunch $((t_first - t_kill)) ms after the kill; back at step $killed_at_step after $((t_back - t_kill)) ms ($((killed_at_step - last_ckpt)) steps redone; checkpoint every 50)"
