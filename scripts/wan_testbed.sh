#!/usr/bin/env bash
# Islands joined by an emulated wide-area network, on one machine (built like
# scripts/netns_testbed.sh): each island is a network namespace holding several ranks (they talk
# over its loopback: the fast link inside an island), with one veth link (eth0, 10.<net>.<k>.2/24)
# to a WAN router namespace. Every link is shaped with tc tbf in both directions; latency,
# jitter and loss come from a relay process (scripts/wan_relay.py) that the router's policy
# routing puts between the islands (the kernel has no netem). The topology (islands, ranks per
# island, link rate, latency, jitter, loss) is a TOML file, checked by scripts/wan_topology.py.
# Nothing is added to the machine's own network namespace; every address exists only inside the
# namespaces made here.
#
# usage: scripts/wan_testbed.sh TOPOLOGY.toml [--net K] -- CMD [ARGS...]
#   Runs CMD (via `sh -c`) in every island at once with ISLAND_INDEX (0..M-1), NISLANDS,
#   RANKS_PER_ISLAND and HOST0_ADDR (island 0's address) exported; output lines are prefixed
#   "[island k] ". Afterwards prints the bytes each island's link carried, read from the veth
#   counters (/sys/class/net/eth0/statistics in the island), and the total received (the sender's
#   counter sees segmentation-offloaded packets with one header for many segments); with WAN_STATS=FILE
#   also writes them there as JSON; with WAN_SOCKETS=FILE each island's TCP connections are sampled
#   (ss -tin, every 0.2 s, into FILE.<k>) and scripts/wan_sockets.py attributes the payload to the
#   store and the collectives (FILE.json). Tears everything down on exit.
#   Exit status: 0 if every island's command succeeded, 1 otherwise, 2 for a bad topology file
#   (the reason is printed), 77 when this machine cannot build the test bed (reason printed).
#
# Example, two islands of two ranks on 20 Mbit/s, 20 ms links (configs/wan/two_islands.toml):
#   scripts/wan_testbed.sh configs/wan/two_islands.toml -- \
#     'build/atoll launch --nnodes $NISLANDS --node-rank $ISLAND_INDEX --nproc-per-node $RANKS_PER_ISLAND \
#        --rdzv $HOST0_ADDR:29400 -- build/atoll train configs/default.toml --parallel.islands=$NISLANDS'
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || { echo "wan_testbed: usage: $0 TOPOLOGY.toml [--net K] -- CMD" >&2; exit 2; }
TOPO=$1
shift
NET=$(( ($$ % 200) + 20 ))  # 10.NET.k.0/24 per island, varied per run so parallel runs do not collide
while [ $# -gt 0 ]; do
  case "$1" in
    --net) NET=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "wan_testbed: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "wan_testbed: no command after --" >&2; exit 2; }
CMD="$*"

vars=$(python3 "$HERE/wan_topology.py" "$TOPO") || exit 2
eval "$vars"

TAG="atw$$"
R="${TAG}r"
NS=()
RELAY=""
cleanup() {
  [ -n "$RELAY" ] && kill -TERM "$RELAY" 2>/dev/null && wait "$RELAY" 2>/dev/null
  RELAY=""
  for ns in "${NS[@]}" "$R"; do ip netns del "$ns" 2>/dev/null; done
}
skip() { echo "wan_testbed: SKIP: $*" >&2; cleanup; exit 77; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
err=$(ip netns add "$R" 2>&1) || skip "cannot create network namespaces: $err"
ip -n "$R" link set lo up
ip netns exec "$R" sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
  >/dev/null || skip "cannot enable forwarding in the router namespace"

RELAYED=0
if python3 -c "import sys; sys.exit(0 if $LATENCY_MS > 0 or $LOSS > 0 else 1)"; then RELAYED=1; fi

limit() {  # limit NS DEV: tbf on the device's egress
  [ "$RATE" = none ] && return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 64kb latency 400ms 2>&1
}

for k in $(seq 0 $((ISLANDS - 1))); do
  ns="${TAG}i$k"
  ip netns add "$ns" || skip "cannot create namespace $ns"
  NS+=("$ns")
  ip -n "$ns" link set lo up
  err=$(ip -n "$R" link add "i$k" type veth peer name eth0 netns "$ns" 2>&1) || skip "cannot create veth pairs: $err"
  ip -n "$R" addr add "10.$NET.$k.1/24" dev "i$k"
  ip -n "$R" link set "i$k" up
  ip -n "$ns" addr add "10.$NET.$k.2/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "10.$NET.$k.1"
  err=$(limit "$ns" eth0) || skip "tc tbf is unavailable: $err"
  err=$(limit "$R" "i$k") || skip "tc tbf is unavailable: $err"
  [ $RELAYED = 1 ] && ip -n "$R" rule add iif "i$k" table 100
done

if [ $RELAYED = 1 ]; then
  [ -c /dev/net/tun ] || skip "no /dev/net/tun for the latency relay"
  ip -n "$R" tuntap add dev tin mode tun 2>/dev/null || skip "cannot create TUN devices"
  ip -n "$R" tuntap add dev tout mode tun
  ip netns exec "$R" python3 "$HERE/wan_relay.py" --in tin --out tout --latency-ms "$LATENCY_MS" \
    --jitter-ms "$JITTER_MS" --loss "$LOSS" &
  RELAY=$!
  ip -n "$R" link set tin up
  ip -n "$R" link set tout up
  ip netns exec "$R" sysctl -q -w net.ipv4.conf.tout.rp_filter=0 net.ipv4.conf.tin.rp_filter=0 >/dev/null
  for _ in $(seq 1 50); do  # the relay has attached when the TUN devices have a carrier
    ip -n "$R" link show tin | grep -q LOWER_UP && ip -n "$R" link show tout | grep -q LOWER_UP && break
    sleep 0.1
  done
  ip -n "$R" route add default dev tin table 100 || skip "cannot route through the relay"
fi
HOST0_ADDR="10.$NET.0.2"
if command -v ping >/dev/null; then
  for k in $(seq 1 $((ISLANDS - 1))); do
    ok=0
    for _ in $(seq 1 50); do
      if ip netns exec "${TAG}i$k" ping -c1 -W1 "$HOST0_ADDR" >/dev/null 2>&1; then ok=1; break; fi
      sleep 0.1
    done
    [ $ok = 1 ] || { echo "wan_testbed: island $k cannot reach $HOST0_ADDR" >&2; exit 1; }
  done
fi
echo "wan_testbed: $ISLANDS islands x $RANKS_PER_ISLAND ranks on 10.$NET.0.0/16; links $RATE each way," \
  "latency ${LATENCY_MS} ms +- ${JITTER_MS} ms, loss $LOSS" >&2

counter() { ip netns exec "$1" cat "/sys/class/net/eth0/statistics/$2"; }
declare -a TX0 RX0
for k in $(seq 0 $((ISLANDS - 1))); do
  TX0[$k]=$(counter "${TAG}i$k" tx_bytes)
  RX0[$k]=$(counter "${TAG}i$k" rx_bytes)
done
t0=$(date +%s.%N)
samplers=()
if [ -n "${WAN_SOCKETS:-}" ]; then  # per-connection counters, attributed by scripts/wan_sockets.py
  for k in $(seq 0 $((ISLANDS - 1))); do
    ip netns exec "${TAG}i$k" sh -c 'while :; do ss -tinH; echo ---; sleep 0.2; done' > "$WAN_SOCKETS.$k" 2>/dev/null &
    samplers+=($!)
  done
fi
pids=()
for k in $(seq 0 $((ISLANDS - 1))); do
  ip netns exec "${TAG}i$k" env ISLAND_INDEX="$k" NISLANDS="$ISLANDS" RANKS_PER_ISLAND="$RANKS_PER_ISLAND" \
    HOST0_ADDR="$HOST0_ADDR" sh -c "$CMD" 2>&1 | sed -u "s/^/[island $k] /" &
  pids+=($!)
done
rc=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}" || { echo "wan_testbed: island $k's command failed" >&2; rc=1; }
done
secs=$(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo 0)
for p in "${samplers[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
[ -n "${WAN_SOCKETS:-}" ] && python3 "$HERE/wan_sockets.py" "$WAN_SOCKETS" "$ISLANDS" --out "$WAN_SOCKETS.json" >&2
total=0
json="{\"islands\": $ISLANDS, \"ranks_per_island\": $RANKS_PER_ISLAND, \"rate\": \"$RATE\", \"latency_ms\": $LATENCY_MS, \"seconds\": ${secs:-0}, \"links\": ["
for k in $(seq 0 $((ISLANDS - 1))); do
  tx=$(( $(counter "${TAG}i$k" tx_bytes) - TX0[k] ))
  rx=$(( $(counter "${TAG}i$k" rx_bytes) - RX0[k] ))
  total=$(( total + rx ))  # what arrived: every byte that crossed the WAN reaches exactly one island
  echo "wan_testbed: island $k link (veth counters): sent $tx bytes, received $rx bytes" >&2
  json+="$([ $k -gt 0 ] && echo ", "){\"island\": $k, \"tx_bytes\": $tx, \"rx_bytes\": $rx}"
done
json+="], \"total_bytes\": $total}"
echo "wan_testbed: bytes on the wire (all island links, received): $total" >&2
[ -n "${WAN_STATS:-}" ] && echo "$json" > "$WAN_STATS"
exit $rc
