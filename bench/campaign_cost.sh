#!/usr/bin/env bash
# The fault campaign's failure-free cost inside `atoll train` ([fault] campaign with no faults,
# train/fault_campaign_hook.h; docs/fault_tolerance.md), in CPU time, since wall time means little on
# a shared machine:
#  - in-process: rank 0's CPU time in the boundary checks (parameter hash, checkpoint scrub, the
#    boundary all-gathers, the phase fingerprints) and in the gradient checksums, per step, against
#    the process's whole CPU time per step (the hook's "cost" record in campaign/score.json);
#  - pair by pair: the job's CPU time (every rank, user + sys, from the launcher's children) with and
#    without the campaign, alternated REPEAT times; the median of the pairs' ratios.
# gpt2-tiny (2 layers, batch 4 x 64 tokens), 2 ranks, STEPS steps, a checkpoint every 10 (the
# scrub reads the newest one at every boundary). No PyTorch peer: PyTorch has no such campaign.
# Usage: bench/campaign_cost.sh [BUILD_DIR]   (env: STEPS=60 REPEAT=3)
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
STEPS=${STEPS:-60} REPEAT=${REPEAT:-3}
W=$(mktemp -d /tmp/atoll_campaigncost.XXXX)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
source "$(dirname "$0")/tiny_job.sh"
tiny_job_write 10
echo "{\"seed\": 1, \"checkpoint_every\": 10, \"steps\": $STEPS, \"faults\": []}" > "$W/clean.json"
run() {  # name extra...: prints the job's CPU seconds (every rank: the launcher's children)
  local name=$1
  shift
  rm -rf "$W/run_$name"
  python3 - "$W/$name.log" "$A" launch --nproc-per-node 2 -- "$A" train "$W/cfg.toml" --run.dir="$W/run_$name" "$@" <<'PY'
import os, resource, subprocess, sys
env = dict(os.environ, OMP_NUM_THREADS="1")
with open(sys.argv[1], "a") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=log, env=env).returncode
if rc:
    sys.exit(f"the job failed ({rc}): see {sys.argv[1]}")
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)
PY
}
for i in $(seq "$REPEAT"); do
  run plain >> "$W/plain.cpu"
  run campaign --fault.campaign="$W/clean.json" >> "$W/campaign.cpu"
  python3 -c "import json; print(json.dumps(json.load(open('$W/run_campaign/campaign/score.json'))['cost']))" >> "$W/cost.jsonl"
done
python3 - "$W" "$STEPS" <<'PY'
import json, statistics, sys
w, steps = sys.argv[1], int(sys.argv[2])
plain = [float(x) for x in open(f"{w}/plain.cpu")]
camp = [float(x) for x in open(f"{w}/campaign.cpu")]
cost = [json.loads(l) for l in open(f"{w}/cost.jsonl")]
med = lambda k: statistics.median(c[k] for c in cost)
b, c, p = med("boundary_cpu_ms_per_step"), med("checksum_cpu_ms_per_step"), med("process_cpu_ms_per_step")
print(f"rank 0, in-process (median of {len(cost)} runs): boundary checks {b:.3f} ms CPU/step, gradient checksums "
      f"{c:.3f} ms CPU/step, the whole process {p:.2f} ms CPU/step: {100 * (b + c) / p:.1f}% of it")
ratios = [x / y for x, y in zip(camp, plain)]
print(f"pair by pair, the job's CPU time (2 ranks, {steps} steps, start-up included): plain {statistics.median(plain):.2f} s, "
      f"campaign {statistics.median(camp):.2f} s; median ratio {statistics.median(ratios):.3f}x "
      f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})")
PY
