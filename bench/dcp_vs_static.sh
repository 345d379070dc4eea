#!/usr/bin/env bash
# Data-Centric Parallel vs the best static configuration (issue 12, item 5): `atoll train` on 2
# ranks (1 thread each) over the long-tailed variable-length corpus (Debian fortunes' text cut to
# Pareto lengths, data.varlen_lengths = "pareto"), the same batches in the same order for every
# run: the chooser's layout per batch (cp, accumulation split, recompute) against each static
# layout of STATICS ("CPxACCUM" pairs; default 1x1 1x2 1x4 2x1 2x2, no recompute, all fit every
# batch). Tokens/s of a run =
# the batches' targets over steps 2..STEPS / their summed step time (step 1 warms up). The runs
# are taken pair by pair, in rotating order, REPEATS times: the ratio is the median of the per-round
# ratios dcp / best static of that round (best: the fastest static run of the round), so a change
# of the machine's load between rounds cancels out. No PyTorch peer: torch has no per-batch
# context-parallel switching; the peer is atoll's own static configuration, on the same machine.
# Also printed (session 9): tokens/s by CPU time (targets / the slowest rank's forward + backward
# in process CPU seconds, dcp.busy_ms), which a loaded machine does not stretch, and per batch the
# chooser's prediction for each cp against what each static layout measured on that batch.
# usage: [STATICS="1x1 2x1"] [RATE=100mbit LINK_GBPS=0.1] [KEEP=1] [BUILD=dir] bench/dcp_vs_static.sh [STEPS REPEATS SEQ
#        BATCH_TOKENS N_EMBD N_LAYER ALPHA]
# (build first: cmake --build build --target atoll)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8} REPEATS=${2:-3} SEQ=${3:-4096} TOK=${4:-8192} C=${5:-128} L=${6:-2} ALPHA=${7:-1.0}
BUILD=${BUILD:-build}
ATOLL=$(realpath "$BUILD/atoll")
[ -x "$ATOLL" ] || { echo "build first: cmake --build $BUILD --target atoll"; exit 1; }
W=$(mktemp -d /tmp/atoll_dcp_bench.XXXXXX)
# KEEP=1 keeps the runs' directories (metrics.jsonl per run) for a closer look.
if [ -n "${KEEP:-}" ]; then echo "runs kept in $W"; else trap 'rm -rf "$W"' EXIT; fi
cat > "$W/dcp.toml" <<EOF
[data]
dir = "${DCP_DATA:-$W/data}"
varlen_tokens = $TOK
varlen_lengths = "pareto"
varlen_alpha = $ALPHA
varlen_min_len = 32
[model]
preset = "gpt2-tiny"
n_layer = $L
n_embd = $C
n_head = $((C / 32))
block_size = $SEQ
[train]
steps = $STEPS
seq_len = $SEQ
warmup_steps = 2
threads = 1
[eval]
every = 0
[sample]
every = 0
[checkpoint]
every = 0
[log]
every = 1
[hardware]
peak_gflops = 100.0
EOF
# The static layouts: every (cp, accum) of STATICS, no recompute (nothing here is short of memory).
STATICS=${STATICS:-"1x1 1x2 1x4 2x1 2x2"}
declare -A ARGS=([dcp]="")
names=(dcp)
for sc in $STATICS; do
  n=static_cp${sc%x*}_accum${sc#*x}
  names+=("$n")
  ARGS[$n]="--parallel.dcp_cp=${sc%x*} --parallel.dcp_accum=${sc#*x} --parallel.dcp_recompute=none"
done
# RATE (e.g. 100mbit): the 2 ranks on 2 hosts of the network-namespace test bed, their link
# limited to RATE by tbf, and the cost model told so (parallel.dcp_link_gbps = LINK_GBPS).
launch() {  # run name, extra args
  if [ -n "${RATE:-}" ]; then
    scripts/netns_testbed.sh --hosts 2 --rate "$RATE" -- "$ATOLL launch --nnodes 2 --node-rank \$HOST_INDEX \
      --nproc-per-node 1 --rdzv \$HOST0_ADDR:29400 -- $ATOLL train $W/dcp.toml --run.dir=$W/$1 \
      --parallel.dcp_link_gbps=${LINK_GBPS:-0.1} $2"
  else
    # shellcheck disable=SC2086
    "$ATOLL" launch --nproc-per-node 2 -- "$ATOLL" train "$W/dcp.toml" --run.dir="$W/$1" $2
  fi
}
loads=()
N=${#names[@]}
for r in $(seq "$REPEATS"); do
  for k in $(seq 0 $((N - 1))); do
    n=${names[$(( (k + r) % N ))]}
    launch "$n.$r" "${ARGS[$n]}" > "$W/$n.$r.log" 2>&1 || { cat "$W/$n.$r.log"; exit 1; }
  done
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
done
/usr/bin/python3 - "$W" "$REPEATS" "$STEPS" "$SEQ" "$TOK" "$C" "$L" "$ALPHA" "${loads[*]}" "${RATE:-}" "${names[@]}" <<'PY'
import json, statistics as st, sys, platform, collections
w, R, steps, seq, tok, C, L, alpha, loads, rate = sys.argv[1:11]
names = sys.argv[11:]
R = int(R)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
def run(name, r):
    recs = [json.loads(l) for l in open(f"{w}/{name}.{r}/metrics.jsonl") if '"loss"' in l]
    body = recs[1:]
    toks = sum((x["tokens"] - p["tokens"]) for p, x in zip(recs, body))
    # busy_ms: the slowest rank's forward + backward in its process's CPU seconds (the ring's
    # thread included), i.e. the step on dedicated cores, which the load does not stretch.
    return {"tps": toks / (sum(x["step_ms"] for x in body) / 1e3),
            "cpu_tps": toks / (sum(x["dcp"].get("busy_ms", 0) for x in body) / 1e3) if all(x["dcp"].get("busy_ms", 0) > 0 for x in body) else 0,
            "loss": recs[-1]["loss"], "cps": collections.Counter(x["dcp"]["cp"] for x in recs),
            "recs": recs}
runs = {(n, r): run(n, r) for n in names for r in range(1, R + 1)}
statics = names[1:]
print(f"CPU: {cpu}; load average after each round {loads} (a shared machine: figures under load)")
where = f"2 hosts of the netns test bed, links {rate} (tbf)" if rate else "2 ranks on this machine"
print(f"GPT L{L} C{C}, {where}, 1 thread per rank, batches of {tok} targets, documents Pareto(32, alpha {alpha}) "
      f"up to {seq}, steps 2..{steps} of each run, {R} rounds")
short = lambda n: n.replace("static_", "").replace("_accum", "x")
print(f"{'round':<7}" + "".join(f"{short(n):>10}" for n in names) + f"{'dcp/best':>10}   dcp's cp,accum per step")
ratios = []
for r in range(1, R + 1):
    t = {n: runs[(n, r)]["tps"] for n in names}
    ratios.append(t["dcp"] / max(t[n] for n in statics))
    ch = " ".join(f'{x["dcp"]["cp"]},{x["dcp"]["accum"]}' for x in runs[("dcp", r)]["recs"])
    print(f"{r:<7}" + "".join(f"{t[n]:10.0f}" for n in names) + f"{ratios[-1]:10.2f}   {ch}")
m = {n: st.median(runs[(n, r)]["tps"] for r in range(1, R + 1)) for n in names}
best = max(statics, key=lambda n: m[n])
print("medians (tokens/s): " + ", ".join(f"{short(n)} {m[n]:.0f}" for n in names) + f"; best static: {short(best)}")
print(f"DCP / best static (median of per-round ratios, best static of each round): {st.median(ratios):.2f}x")
# Per batch: the chooser's predicted step per cp degree (dcp.predicted_ms_by_cp, the fastest
# candidate of each cp; the gradient reduction and the optimizer left out) against what each
# static layout measured on that batch (median over the rounds; step_ms less opt_ms), so a wrong
# price shows as a cp whose prediction orders differently from its measurement.
print("per batch (ms; medians over rounds): predicted by cp | measured, static layouts (step - optimizer)")
print(f"{'step':<5}{'docs':>5}{'long':>6}{'rows':>5}  " + "".join(f"{'pred cp'+k:>10}" for k in sorted(runs[('dcp', 1)]['recs'][0]['dcp']['predicted_ms_by_cp'])) +
      "".join(f"{short(n):>10}" for n in statics) + "   dcp chose")
for i, x in enumerate(runs[("dcp", 1)]["recs"]):
    d = x["dcp"]
    pred = d["predicted_ms_by_cp"]
    meas = {n: st.median(runs[(n, r)]["recs"][i]["step_ms"] - runs[(n, r)]["recs"][i].get("opt_ms", 0) for r in range(1, R + 1)) for n in statics}
    print(f"{x['step']:<5}{d['docs']:>5}{d['longest']:>6}{d.get('rows', 0):>5}  " + "".join(f"{pred[k]:10.1f}" for k in sorted(pred)) +
          "".join(f"{meas[n]:10.1f}" for n in statics) + f"   cp {d['cp']} x{d['accum']}")
if all(runs[k]["cpu_tps"] > 0 for k in runs):
    print("by CPU time (targets / the slowest rank's forward + backward CPU seconds, steps 2..; load-independent):")
    print(f"{'round':<7}" + "".join(f"{short(n):>10}" for n in names) + f"{'dcp/best':>10}")
    cr = []
    for r in range(1, R + 1):
        t = {n: runs[(n, r)]["cpu_tps"] for n in names}
        cr.append(t["dcp"] / max(t[n] for n in statics))
        print(f"{r:<7}" + "".join(f"{t[n]:10.0f}" for n in names) + f"{cr[-1]:10.2f}")
    mc = {n: st.median(runs[(n, r)]["cpu_tps"] for r in range(1, R + 1)) for n in names}
    print(f"DCP / best static by CPU time (median of per-round ratios): {st.median(cr):.2f}x; best static "
          f"{short(max(statics, key=lambda n: mc[n]))}")
    print("per batch, busy ms (CPU time of the slowest rank's forward + backward; medians over rounds):")
    print(f"{'step':<5}" + "".join(f"{short(n):>10}" for n in names) + "   dcp chose, its compute_scale")
    for i, x in enumerate(runs[("dcp", 1)]["recs"]):
        b = {n: st.median(runs[(n, r)]["recs"][i]["dcp"]["busy_ms"] for r in range(1, R + 1)) for n in names}
        print(f"{x['step']:<5}" + "".join(f"{b[n]:10.1f}" for n in names) +
              f"   cp {x['dcp']['cp']} x{x['dcp']['accum']}, {x['dcp'].get('compute_scale', 1):.3g}")
print("final loss (round 1): " + ", ".join(f"{short(n)} {runs[(n, 1)]['loss']:.6f}" for n in names) +
      " (same batches, same order)")
PY
