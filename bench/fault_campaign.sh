#!/usr/bin/env bash
# The fault-injection campaign (issue 14 item 4; docs/fault_tolerance.md): every one of the 21 fault
# types of the lm-resiliency catalog really injected at a step boundary on the rank the seeded
# campaign file draws, in one job of the toy model per world size (restarted from its checkpoints
# after each fatal fault), then the exact score table: the reported rank set against the injected
# one (an extra rank is an error), inconclusive where a vote has no strict majority.
# Usage: bench/fault_campaign.sh [BUILD_DIR] [CAMPAIGN.json]
#   env: WORLDS="4 2"  SEEDS="14"  (each seed redraws every fault's rank and step jitter)
set -euo pipefail
BUILD=${1:-build}
CAMPAIGN=${2:-$(dirname "$0")/../tests/resilience/campaign_21.json}
T=$(realpath "$BUILD/tests/resilience/test_resilience")
WORLDS=${WORLDS:-4 2}
SEEDS=${SEEDS:-14}
W=$(mktemp -d /tmp/atoll_campaign.XXXX)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for seed in $SEEDS; do
  sed -E "s/\"seed\": *[0-9]+/\"seed\": $seed/" "$CAMPAIGN" > "$W/campaign.json"
  for world in $WORLDS; do
    echo "== seed $seed, $world ranks =="
    "$T" --campaign "$W/campaign.json" "$world" "$W/run_${seed}_$world" || status=1
  done
done
exit $status
