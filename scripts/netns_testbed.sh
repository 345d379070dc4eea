#!/usr/bin/env bash
# Multi-host test bed on one machine: N "hosts" are Linux network namespaces, each with one veth
# link (eth0, 10.77.<net>.<i+1>/24) to a bridge that lives in its own "switch" namespace, with a
# tc token-bucket (tbf) rate limit on every link in both directions. Nothing is added to the
# machine's own network namespace, and every address used exists only inside these namespaces.
#
# usage: scripts/netns_testbed.sh [--hosts N] [--rate RATE|none] [--net K] -- CMD [ARGS...]
#   Runs CMD in every host at once (via `sh -c`), with HOST_INDEX (0..N-1), NHOSTS and
#   HOST0_ADDR (host 0's address, e.g. for `atoll launch --rdzv $HOST0_ADDR:29400`) exported;
#   output lines are prefixed "[host i] ". Tears everything down on exit, also on failure.
#   Exit status: 0 if every host's command succeeded, 1 otherwise, 77 when this machine cannot
#   build the test bed (not root, no network namespaces, veth or tbf); the reason is printed.
#
# Example, two 2-rank hosts on 1 Gbit/s links:
#   scripts/netns_testbed.sh --hosts 2 --rate 1gbit -- \
#     'build/atoll launch --nnodes $NHOSTS --node-rank $HOST_INDEX --nproc-per-node 2 \
#        --rdzv $HOST0_ADDR:29400 -- build/atoll train configs/tiny.toml'
set -uo pipefail

HOSTS=2
RATE=1gbit
NET=$(( ($$ % 200) + 20 ))  # 10.77.NET.0/24, varied per run so parallel runs do not collide
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --net) NET=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "netns_testbed: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "netns_testbed: no command after --" >&2; exit 2; }
CMD="$*"

skip() { echo "netns_testbed: SKIP: $*" >&2; cleanup; exit 77; }

TAG="atl$$"
SW="${TAG}sw"
NS=()
cleanup() {
  for ns in "${NS[@]}" "$SW"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
err=$(ip netns add "$SW" 2>&1) || skip "cannot create network namespaces: $err"
ip -n "$SW" link set lo up
err=$(ip -n "$SW" link add br0 type bridge forward_delay 0 stp_state 0 2>&1) || skip "cannot create a bridge: $err"
ip -n "$SW" link set br0 up

limit() {  # limit NS DEV: tbf on the device's egress
  [ "$RATE" = none ] && return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 100ms 2>&1
}

for i in $(seq 0 $((HOSTS - 1))); do
  ns="${TAG}h$i"
  ip netns add "$ns" || skip "cannot create namespace $ns"
  NS+=("$ns")
  ip -n "$ns" link set lo up
  err=$(ip -n "$SW" link add "h$i" type veth peer name eth0 netns "$ns" 2>&1) || skip "cannot create veth pairs: $err"
  ip -n "$SW" link set "h$i" master br0 up
  ip -n "$ns" addr add "10.77.$NET.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  # Both directions of the link: the host's egress and the switch port's egress (host ingress).
  err=$(limit "$ns" eth0) || skip "tc tbf is unavailable: $err"
  err=$(limit "$SW" "h$i") || skip "tc tbf is unavailable: $err"
done
HOST0_ADDR="10.77.$NET.1"
# Links are up when host 0 answers from every other host (checked when ping is installed; the
# ranks' own connections retry anyway).
if command -v ping >/dev/null; then
  for i in $(seq 1 $((HOSTS - 1))); do
    ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "${TAG}h$i" ping -c1 -W1 "$HOST0_ADDR" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    [ $ok = 1 ] || { echo "netns_testbed: host $i cannot reach $HOST0_ADDR" >&2; exit 1; }
  done
fi
echo "netns_testbed: $HOSTS hosts on 10.77.$NET.0/24, rate limit $RATE per link direction" >&2

pids=()
for i in $(seq 0 $((HOSTS - 1))); do
  ip netns exec "${TAG}h$i" env HOST_INDEX="$i" NHOSTS="$HOSTS" HOST0_ADDR="$HOST0_ADDR" \
    sh -c "$CMD" 2>&1 | sed -u "s/^/[host $i] /" &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "netns_testbed: host $i's command failed" >&2; rc=1; }
done
exit $rc
