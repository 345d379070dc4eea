#!/usr/bin/env bash
# Weight sync (rl/weight_sync.h) vs model size on loopback, atoll vs PyTorch, in one run: 2 ranks,
# rank 0 pushes the weights of GPTs of 0.4M-25M parameters in flat buckets of BUCKET_MB (one
# Gloo broadcast each, for both); prints the median push time (the slowest rank's), the ratio
# atoll/torch (< 1: atoll faster) and the CPU. Target: <= 50 ms for 10M parameters.
# usage: bench/rl_sync_vs_torch.sh [BUCKET_MB] [REPS]    (build: --target atoll bench_weight_sync)
set -euo pipefail
cd "$(dirname "$0")/.."
BUCKET=${1:-4} REPS=${2:-7}
BUILD=${BUILD:-build}
[ -x "$BUILD/bench/bench_weight_sync" ] && [ -x "$BUILD/atoll" ] || { echo "build first: cmake --build $BUILD --target atoll bench_weight_sync"; exit 1; }
atoll=$("$BUILD/atoll" launch --nproc-per-node 2 -- "$BUILD/bench/bench_weight_sync" "$BUCKET" "$REPS" | sed -n 's/^\[rank 0\] //; /^{/p' | grep '^{')
sizes=$(echo "$atoll" | /usr/bin/python3 -c 'import sys,json; print(" ".join(str(json.loads(l)["params"]) for l in sys.stdin))')
torch=$(/usr/bin/python3 tools/bench_torch_broadcast.py "$BUCKET" "$REPS" $sizes 2>/dev/null || true)
/usr/bin/python3 - "$atoll" "$torch" "$BUCKET" <<'PY'
import json, sys
a = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
t = {json.loads(l)["params"]: json.loads(l) for l in sys.argv[2].splitlines() if l.strip()}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}; 2 ranks on loopback ({a[0]['backend']}), {sys.argv[3]} MB buckets; medians")
print(f"{'params':>10}{'tensors':>9}{'buckets':>9}{'atoll ms':>10}{'torch ms':>10}{'ratio':>7}")
for r in a:
    p = t.get(r["params"])
    tm = f"{p['median_ms']:10.1f}{r['median_ms'] / p['median_ms']:7.2f}" if p else "  (no torch)"
    print(f"{r['params']:>10}{r['tensors']:>9}{r['buckets']:>9}{r['median_ms']:10.1f}{tm}")
PY
