#!/usr/bin/env bash
# Activation recomputation, atoll against PyTorch in one run on the same machine: for each of
# recompute = none, selective, full, one process per (implementation, mode), alternating, the
# median step time, the peak RSS and atoll's peak activation bytes (allocator high-water mark per
# step), then each mode's time and memory relative to none and atoll's step time over PyTorch's.
# usage: bench/recompute_vs_torch.sh [PRESET] [B] [T] [THREADS] [STEPS] [ROUNDS]
# MODEL="n_layer n_embd n_head vocab" overrides the preset's shape (a small vocabulary keeps the
# logits from dominating the activations).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-d384}; B=${2:-4}; T=${3:-256}; THREADS=${4:-$(nproc)}; STEPS=${5:-3}; ROUNDS=${6:-3}
BIN=build/bench/bench_recompute
[ -x "$BIN" ] || { echo "build first: cmake --build build --target bench_recompute"; exit 1; }
echo "preset=$PRESET ${MODEL:+model=($MODEL)} B=$B T=$T threads=$THREADS steps=$STEPS rounds=$ROUNDS $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
for r in $(seq "$ROUNDS"); do
  for mode in none selective full; do
    rows+=("$(OMP_NUM_THREADS=$THREADS "$BIN" "$PRESET" "$B" "$T" "$THREADS" "$STEPS" $mode ${MODEL:-})")
    rows+=("$(OMP_NUM_THREADS=$THREADS /usr/bin/python3 tools/bench_torch_recompute.py "$PRESET" "$B" "$T" "$THREADS" "$STEPS" $mode ${MODEL:-})")
  done
done
/usr/bin/python3 - "${rows[@]}" <<'PY'
import json, statistics as st, sys
rows = [json.loads(r) for r in sys.argv[1:]]
def med(impl, mode, key):
    return st.median([r[key] for r in rows if r["impl"].startswith(impl) and r["recompute"] == mode])
for mode in ("none", "selective", "full"):
    a, t = med("atoll", mode, "step_s"), med("pytorch", mode, "step_s")
    print(f"{mode:<9} atoll {a*1e3:8.1f} ms ({a/med('atoll','none','step_s'):4.2f}x none)  "
          f"activations {med('atoll', mode, 'peak_activation_bytes')/2**20:7.1f} MiB "
          f"({med('atoll', mode, 'peak_activation_bytes')/med('atoll','none','peak_activation_bytes'):4.2f}x)  "
          f"rss {med('atoll', mode, 'max_rss_bytes')/2**20:7.1f} MiB | "
          f"pytorch {t*1e3:8.1f} ms ({t/med('pytorch','none','step_s'):4.2f}x none)  "
          f"rss {med('pytorch', mode, 'max_rss_bytes')/2**20:7.1f} MiB | atoll/pytorch time {a/t:4.2f}")
losses = {r["loss"] for r in rows if r["impl"] == "atoll"}
print("atoll loss identical across modes:", len(losses) == 1)
PY
