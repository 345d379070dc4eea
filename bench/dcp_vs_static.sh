#!/usr/bin/env bash
# Data-Centric Parallel vs the best static configuration (issue 12, item 5): `atoll train` on 2
# ranks (1 thread each) over the long-tailed variable-length corpus (Debian fortunes' text cut to
# Pareto lengths, data.varlen_lengths = "pareto"), the same batches in the same order for every
# run: the chooser's layout per batch (cp, accumulation split, recompute) against each static
# layout that fits every batch (cp 1 and cp 2, one micro-batch, no recompute). Tokens/s of a run =
# the batches' targets over steps 2..STEPS / their summed step time (step 1 warms up). The runs
# are taken pair by pair, in rotating order, REPEATS times: the ratio is the median of the per-round
# ratios dcp / best static of that round (best: the faster static run of the round), so a change
# of the machine's load between rounds cancels out. No PyTorch peer: torch has no per-batch
# context-parallel switching; the peer is atoll's own static configuration, on the same machine.
# usage: bench/dcp_vs_static.sh [STEPS REPEATS SEQ BATCH_TOKENS N_EMBD N_LAYER ALPHA]
# (build first: cmake --build build --target atoll)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8} REPEATS=${2:-3} SEQ=${3:-4096} TOK=${4:-8192} C=${5:-128} L=${6:-2} ALPHA=${7:-1.0}
BUILD=${BUILD:-build}
ATOLL=$(realpath "$BUILD/atoll")
[ -x "$ATOLL" ] || { echo "build first: cmake --build $BUILD --target atoll"; exit 1; }
W=$(mktemp -d /tmp/atoll_dcp_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
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
declare -A ARGS=([dcp]="" [static_cp1]="--parallel.dcp_cp=1 --parallel.dcp_accum=1 --parallel.dcp_recompute=none"
                 [static_cp2]="--parallel.dcp_cp=2 --parallel.dcp_accum=1 --parallel.dcp_recompute=none")
names=(dcp static_cp1 static_cp2)
loads=()
for r in $(seq "$REPEATS"); do
  for k in 0 1 2; do
    n=${names[$(( (k + r) % 3 ))]}
    # shellcheck disable=SC2086
    "$ATOLL" launch --nproc-per-node 2 -- "$ATOLL" train "$W/dcp.toml" --run.dir="$W/$n.$r" ${ARGS[$n]} \
      > "$W/$n.$r.log" 2>&1 || { cat "$W/$n.$r.log"; exit 1; }
  done
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
done
/usr/bin/python3 - "$W" "$REPEATS" "$STEPS" "$SEQ" "$TOK" "$C" "$L" "$ALPHA" "${loads[*]}" <<'PY'
import json, statistics as st, sys, platform, collections
w, R, steps, seq, tok, C, L, alpha, loads = sys.argv[1:10]
R = int(R)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
def run(name, r):
    recs = [json.loads(l) for l in open(f"{w}/{name}.{r}/metrics.jsonl") if '"loss"' in l]
    body = recs[1:]
    return {"tps": sum((x["tokens"] - p["tokens"]) for p, x in zip(recs, body)) /
                   (sum(x["step_ms"] for x in body) / 1e3),
            "loss": recs[-1]["loss"], "cps": collections.Counter(x["dcp"]["cp"] for x in recs),
            "recs": recs}
runs = {(n, r): run(n, r) for n in ("dcp", "static_cp1", "static_cp2") for r in range(1, R + 1)}
print(f"CPU: {cpu}; load average after each round {loads} (a shared machine: figures under load)")
print(f"GPT L{L} C{C}, 2 ranks x 1 thread, batches of {tok} targets, documents Pareto(32, alpha {alpha}) "
      f"up to {seq}, steps 2..{steps} of each run, {R} rounds")
print(f"{'round':<7}{'dcp tok/s':>11}{'cp1 tok/s':>11}{'cp2 tok/s':>11}{'dcp/best':>10}   dcp's cp per step")
ratios = []
for r in range(1, R + 1):
    d, a, b = (runs[(n, r)]["tps"] for n in ("dcp", "static_cp1", "static_cp2"))
    ratios.append(d / max(a, b))
    cps = "".join(str(x["dcp"]["cp"]) for x in runs[("dcp", r)]["recs"])
    print(f"{r:<7}{d:11.0f}{a:11.0f}{b:11.0f}{ratios[-1]:10.2f}   {cps}")
m = lambda n: st.median(runs[(n, r)]["tps"] for r in range(1, R + 1))
best = "static_cp1" if m("static_cp1") >= m("static_cp2") else "static_cp2"
print(f"medians: dcp {m('dcp'):.0f} tok/s, static cp1 {m('static_cp1'):.0f}, static cp2 {m('static_cp2'):.0f}; "
      f"best static by median: {best}")
print(f"DCP / best static (median of per-round ratios): {st.median(ratios):.2f}x")
l = [runs[(n, 1)]["loss"] for n in ("dcp", "static_cp1", "static_cp2")]
print(f"final loss (round 1): dcp {l[0]:.6f}, cp1 {l[1]:.6f}, cp2 {l[2]:.6f} (same batches, same order)")
PY
