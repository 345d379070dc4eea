#!/usr/bin/env bash
# The cost of SCOUT's cross-replay in `atoll train` ([fault] replay_every, train/replay_hook.h;
# issue 14, docs/fault_tolerance.md "The replay's cost"): failure-free median step time of plain
# DDP against DDP auditing every step and every 10th step, on the small ft job (RANKS ranks,
# 1 thread each), rounds interleaved so that the machine's swings fall on every variant.
# Expected: an audited step does 1 + witnesses forward/backward passes (witnesses = min(2, RANKS-1))
# and gives up its communication overlap; every 10th step costs a tenth of that.
# No PyTorch peer: PyTorch has no replay. Usage: bench/replay_cost.sh [BUILD_DIR]
#   env: RANKS=4 STEPS=200 ROUNDS=3
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
RANKS=${RANKS:-4}
STEPS=${STEPS:-200}
ROUNDS=${ROUNDS:-3}
W=$(mktemp -d /tmp/atoll_replaycost.XXXX)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
. "$(dirname "$0")/ft_job.sh"
ft_job_write 0

mean_ms() {  # mean step_ms over steps 11.. of a metrics.jsonl (the mean: a periodic audit's cost is
  # in the audited tenth of the steps, which a median would leave out)
  python3 -c '
import json, statistics, sys
v = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "step_ms" in l]
print("%.3f" % statistics.mean(v[10:]))' "$1"
}
declare -A runs
for round in $(seq "$ROUNDS"); do
  for v in plain every10 every1; do
    case $v in
      plain) extra=() ;;
      every10) extra=(--fault.replay_every=10) ;;
      every1) extra=(--fault.replay_every=1) ;;
    esac
    d="$W/$v.$round"
    OMP_NUM_THREADS=1 "$A" launch --nproc-per-node "$RANKS" -- "$A" train "$W/cfg.toml" --run.dir="$d" \
      "${extra[@]}" > "$d.log" 2>&1 || { echo "$v failed:"; tail -5 "$d.log"; exit 1; }
    runs[$v]="${runs[$v]:-} $(mean_ms "$d/metrics.jsonl")"
  done
done
python3 - "$RANKS" "${runs[plain]}" "${runs[every10]}" "${runs[every1]}" <<'PY'
import statistics, sys
ranks = int(sys.argv[1])
p, t, a = [list(map(float, s.split())) for s in sys.argv[2:]]
print("%d ranks, mean step time per round (ms), and the median over rounds:" % ranks)
b = statistics.median(p)
for name, v in [("DDP", p), ("DDP + replay every 10th step", t), ("DDP + replay every step", a)]:
    m = statistics.median(v)
    print("  %-30s %s  -> %8.2f ms  x%.3f" % (name, " ".join("%7.2f" % x for x in v), m, m / b))
print("  (a replayed step costs 1 + %d forward/backward passes: x%d compute at most)" % (min(2, ranks - 1), 1 + min(2, ranks - 1)))
PY
