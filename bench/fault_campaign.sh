#!/usr/bin/env bash
# The fault-injection campaign (issue 14 item 4; docs/fault_tolerance.md): every one of the 21 fault
# types of the lm-resiliency catalog really injected at a step boundary on the rank the seeded
# campaign file draws, in one job of the toy model per world size (restarted from its checkpoints
# after each fatal fault), then the exact score table: the reported rank set against the injected
# one (an extra rank is an error), inconclusive where a vote has no strict majority.
# Usage: bench/fault_campaign.sh [BUILD_DIR] [CAMPAIGN.json]
#   env: WORLDS="4 2"  SEEDS="14"  (each seed redraws every fault's rank and step jitter)
#        NETNS=1 (root): the namespace test bed. Every rank runs in a network namespace of its own,
#        its link e0 on a bridge in a hub namespace where the driver and its lighthouse run, and
#        network_partition is `ip link set e0 down` inside the rank's namespace (without NETNS the
#        partition is injected at the communicator, as in the unit test). Namespaces ftc<PID>_*,
#        removed on exit.
set -euo pipefail
BUILD=${1:-build}
CAMPAIGN=${2:-$(dirname "$0")/../tests/resilience/campaign_21.json}
T=$(realpath "$BUILD/tests/resilience/test_resilience")
WORLDS=${WORLDS:-4 2}
SEEDS=${SEEDS:-14}
W=$(mktemp -d /tmp/atoll_campaign.XXXX)
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
P=ftc$$_
cleanup_netns() {
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P" || true); do ip netns del "$ns"; done
}
trap 'cleanup_netns; rm -rf "$W"' EXIT
# Hub namespace with a bridge (10.77.0.254) and one namespace per rank (10.77.0.<rank+1> on e0).
make_netns() {
  local world=$1
  cleanup_netns
  ip netns add "${P}hub"
  ip -n "${P}hub" link set lo up
  ip -n "${P}hub" link add br0 type bridge
  ip -n "${P}hub" addr add 10.77.0.254/24 dev br0
  ip -n "${P}hub" link set br0 up
  for r in $(seq 0 $((world - 1))); do
    ip netns add "${P}$r"
    ip -n "${P}$r" link set lo up
    ip -n "${P}hub" link add "h$r" type veth peer name e0 netns "${P}$r"
    ip -n "${P}hub" link set "h$r" master br0 up
    ip -n "${P}$r" addr add "10.77.0.$((r + 1))/24" dev e0
    ip -n "${P}$r" link set e0 up
  done
}
status=0
for seed in $SEEDS; do
  sed -E "s/\"seed\": *[0-9]+/\"seed\": $seed/" "$CAMPAIGN" > "$W/campaign.json"
  for world in $WORLDS; do
    echo "== seed $seed, $world ranks${NETNS:+, namespace test bed} =="
    if [[ ${NETNS:-0} == 1 ]]; then
      make_netns "$world"
      ATOLL_CAMPAIGN_NETNS="$P" ATOLL_CAMPAIGN_MASTER=10.77.0.1 ATOLL_CAMPAIGN_LIGHTHOUSE_HOST=10.77.0.254 \
        ATOLL_CAMPAIGN_IFACE=e0 ip netns exec "${P}hub" "$T" --campaign "$W/campaign.json" "$world" \
        "$W/run_${seed}_$world" || status=1
    else
      "$T" --campaign "$W/campaign.json" "$world" "$W/run_${seed}_$world" || status=1
    fi
  done
done
exit $status
