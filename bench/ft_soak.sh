#!/usr/bin/env bash
# The fault-tolerance soak (issue 14's benchmark; docs/fault_tolerance.md, "The soak"): RANKS quorum
# replicas and SPARES hot spares under `atoll launch --ft`, a random fault every MIN_GAP..MAX_GAP
# seconds for DURATION seconds — kill -9 of a random `atoll train` process of the job (a replica or
# a waiting spare), or SIGSTOP of one for 5-20 s and SIGCONT — then SIGTERM to the launcher.
# Checked from the replicas' own metrics (fault.commit_hashes: every committed step's weight hash
# and wall-clock commit time, in every replica's and spare's run directory):
#   - never MAX_STALL_S (60) seconds without a committed step, from the first commit to the stop;
#   - at every committed step, every replica that committed it holds the same weights (one hash).
# Exits 1 if either fails. No PyTorch peer: torchft is not a Debian package.
# Usage: bench/ft_soak.sh [BUILD_DIR]
#   env: DURATION=1800 RANKS=4 SPARES=1 MIN_GAP=30 MAX_GAP=120 SEED=1 MAX_STALL_S=60 WORK=(a temp dir)
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
DURATION=${DURATION:-1800}
RANKS=${RANKS:-4}
SPARES=${SPARES:-1}
MIN_GAP=${MIN_GAP:-30}
MAX_GAP=${MAX_GAP:-120}
MAX_STALL_S=${MAX_STALL_S:-60}
RANDOM=${SEED:-1}
STEPS=100000000  # more than any soak runs: the job ends by SIGTERM
if [ -n "${WORK:-}" ]; then
  [ -e "$WORK" ] && { echo "WORK=$WORK exists: give a new directory (nothing of an earlier soak is overwritten)" >&2; exit 2; }
  mkdir -p "$WORK"; W=$(realpath "$WORK"); KEEP=1
else
  W=$(mktemp -d /tmp/atoll_soak.XXXX); KEEP=0
fi
LP=
cleanup() {
  [ -n "$LP" ] && { pkill -CONT -P "$LP" 2>/dev/null || true; kill "$LP" 2>/dev/null || true; }
  [ "$KEEP" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "soak: $RANKS replicas + $SPARES spare(s), $DURATION s, a fault every $MIN_GAP-$MAX_GAP s, seed ${SEED:-1}, work dir $W"

. "$(dirname "$0")/ft_job.sh"
ft_job_write 500

OMP_NUM_THREADS=1 "$A" launch --nproc-per-node "$RANKS" --ft --spares "$SPARES" --max-restarts 1000 -- \
  "$A" train "$W/cfg.toml" --run.dir="$W/run" --fault.snapshot_every=10 --fault.commit_hashes=true \
  --log.every=500 > "$W/launch.log" 2>&1 &
LP=$!
t0=$SECONDS
# The first commit starts the clock of the faults.
until grep -qs '"param_hash"' "$W/run/replica0/metrics.jsonl"; do
  kill -0 "$LP" 2>/dev/null || { echo "the job ended before its first step:"; tail -20 "$W/launch.log"; exit 1; }
  [ $((SECONDS - t0)) -gt 120 ] && { echo "no first commit within 120 s:"; tail -20 "$W/launch.log"; exit 1; }
  sleep 0.2
done
t_start=$(date +%s.%N)
end=$((SECONDS + DURATION))
kills=0 stops=0
: > "$W/faults.log"
while :; do
  gap=$((MIN_GAP + RANDOM % (MAX_GAP - MIN_GAP + 1)))
  [ $((SECONDS + gap)) -ge "$end" ] && break
  sleep "$gap"
  kill -0 "$LP" 2>/dev/null || { echo "the launcher ended during the soak:"; tail -30 "$W/launch.log"; exit 1; }
  mapfile -t kids < <(pgrep -P "$LP" -f " train " || true)
  [ "${#kids[@]}" -eq 0 ] && continue
  v=${kids[RANDOM % ${#kids[@]}]}
  what=$(tr '\0' ' ' < "/proc/$v/cmdline" 2>/dev/null | grep -o -- '--fault.spare=true' || true)
  who="pid $v${what:+ (started as a spare)}"
  if ((RANDOM % 2)); then
    kill -9 "$v" 2>/dev/null && kills=$((kills + 1))
    echo "$(date +%s.%N) $((SECONDS - t0)) s: kill -9 $who" | tee -a "$W/faults.log"
  else
    s=$((5 + RANDOM % 16))
    kill -STOP "$v" 2>/dev/null && stops=$((stops + 1))
    echo "$(date +%s.%N) $((SECONDS - t0)) s: SIGSTOP $who for $s s" | tee -a "$W/faults.log"
    sleep "$s"
    kill -CONT "$v" 2>/dev/null || true
  fi
done
sleep $((end > SECONDS ? end - SECONDS : 0))
t_stop=$(date +%s.%N)
kill -TERM "$LP"
wait "$LP" && rc=0 || rc=$?
LP=
echo "launcher exit code after SIGTERM: $rc; faults: $kills kill -9, $stops SIGSTOP"
grep -E "spare .* takes|starting spare|starting it again|no spare left" "$W/launch.log" | sed 's/^/  /' | sort | uniq -c | sort -rn | head -12
python3 - "$W/run" "$t_start" "$t_stop" "$MAX_STALL_S" <<'PY'
import glob, json, os, sys
run, t_start, t_stop, max_stall = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
first = {}   # step -> earliest commit time over the replicas
hashes = {}  # step -> {hash: [run dirs]}
for m in sorted(glob.glob(os.path.join(run, "replica*", "metrics.jsonl"))):
    who = os.path.basename(os.path.dirname(m))
    for line in open(m):
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut by kill -9
        if "param_hash" not in r:
            continue
        s, t = r["step"], r["committed_unix_s"]
        first[s] = min(first.get(s, t), t)
        hashes.setdefault(s, {}).setdefault(r["param_hash"], []).append(who)
steps = sorted(first)
times = sorted(t for t in first.values() if t_start <= t <= t_stop)
edges = [t_start] + times + [t_stop]
stall = max(b - a for a, b in zip(edges, edges[1:]))
worst = max(range(len(edges) - 1), key=lambda i: edges[i + 1] - edges[i])
split = {s: h for s, h in hashes.items() if len(h) > 1}
per = sorted(len(sum(h.values(), [])) for h in hashes.values())
print("committed steps %d..%d (%d), %.0f s soaked; replicas per committed step: median %d, min %d"
      % (steps[0], steps[-1], len(steps), t_stop - t_start, per[len(per) // 2], per[0]))
print("longest time without a commit: %.2f s (from %.0f s into the soak; limit %.0f s)"
      % (stall, edges[worst] - t_start, max_stall))
print("steps whose replicas hold different weights: %d" % len(split))
for s in sorted(split)[:5]:
    print("  step %d: %s" % (s, "; ".join("%s: %s" % (h, ",".join(w)) for h, w in split[s].items())))
ok = stall < max_stall and not split and len(steps) > 0
print("soak: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
