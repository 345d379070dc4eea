#!/usr/bin/env bash
# Gradient coding inside `atoll train` ([parallel] strategy = "coded", resilience/coded_strategy.h;
# docs/fault_tolerance.md): rank 0's median step time of a 4-rank coded job (s = 1) with and without
# a straggler (rank 2 sleeping DELAY_MS after its backward on each step it is not behind), beside the
# uncoded run of the same data (DDP over 2 ranks, one per group). The model is gpt2-tiny (2 layers,
# batch 4 x 64 tokens), a real forward and backward. Each configuration REPEAT times, alternated;
# medians. No PyTorch peer: PyTorch has no gradient coding; the baselines are these runs.
# Usage: bench/coded_train.sh [BUILD_DIR]   (env: STEPS=60 DELAY_MS=500 REPEAT=3)
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
STEPS=${STEPS:-60} DELAY_MS=${DELAY_MS:-500} REPEAT=${REPEAT:-3}
W=$(mktemp -d /tmp/atoll_codedbench.XXXX)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
source "$(dirname "$0")/tiny_job.sh"
tiny_job_write 0
run() {  # name ranks extra...
  local name=$1 n=$2
  shift 2
  rm -rf "$W/run_$name"
  OMP_NUM_THREADS=1 "$A" launch --nproc-per-node "$n" -- "$A" train "$W/cfg.toml" --run.dir="$W/run_$name" "$@" \
    >> "$W/$name.log" 2>&1
  python3 -c "
import json, statistics, sys
r = [json.loads(l) for l in open('$W/run_$name/metrics.jsonl')]
print(statistics.median(x['step_ms'] for x in r if 'step_ms' in x))" >> "$W/$name.ms"
}
for i in $(seq "$REPEAT"); do
  run ddp2 2
  run coded 4 --parallel.strategy=coded
  run coded_straggler 4 --parallel.strategy=coded --parallel.coded_delay_rank=2 --parallel.coded_delay_ms="$DELAY_MS"
done
python3 - "$W" "$DELAY_MS" <<'PY'
import statistics, sys
w, d = sys.argv[1], sys.argv[2]
m = {k: statistics.median(float(x) for x in open(f"{w}/{k}.ms")) for k in ("ddp2", "coded", "coded_straggler")}
print(f"rank 0 median step (median of runs): ddp over 2 ranks {m['ddp2']:.1f} ms, coded 4 ranks {m['coded']:.1f} ms, "
      f"coded with rank 2 +{d} ms/step {m['coded_straggler']:.1f} ms")
print(f"straggler / no straggler (coded): {m['coded_straggler'] / m['coded']:.3f}x (issue target <= 1.15x)")
PY
grep -h "decoded" "$W/coded_straggler.log" | grep "rank 0" | tail -1 || true
