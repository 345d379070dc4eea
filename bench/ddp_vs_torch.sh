#!/usr/bin/env bash
# Data parallelism, atoll vs PyTorch, same GPT, per-rank batch, threads and machine, in one run:
#  - DDP on 2 ranks vs 1 rank (scaling) and the share of gradient communication hidden behind backward;
#  - ZeRO-3 peak memory per rank vs DDP, and its step time;
#  - PyTorch DDP and FSDP (Gloo) on 2 processes; the ratios of step times (atoll/torch, < 1: atoll
#    faster) and, for ZeRO-3 vs FSDP, of peak memory per rank.
# usage: bench/ddp_vs_torch.sh [N_LAYER N_EMBD N_HEAD B T STEPS THREADS_PER_RANK BUCKET_MB]
# The default bucket (1 MB) gives a 3M-parameter model about as many buckets as GPT-2 small has at 25 MB.
# (build first: cmake --build build --target atoll bench_ddp)
set -euo pipefail
cd "$(dirname "$0")/.."
L=${1:-4} C=${2:-256} H=${3:-4} B=${4:-4} T=${5:-128} STEPS=${6:-6} TH=${7:-1} BUCKET=${8:-1}
BUILD=${BUILD:-build}
ATOLL=$BUILD/atoll
BENCH=$BUILD/bench/bench_ddp
[ -x "$BENCH" ] && [ -x "$ATOLL" ] || { echo "build first: cmake --build $BUILD --target atoll bench_ddp"; exit 1; }
args="$L $C $H $B $T $STEPS $BUCKET $TH"
one=$(OMP_NUM_THREADS=$TH "$BENCH" ddp $args)
ddp=$("$ATOLL" launch --nproc-per-node 2 -- "$BENCH" ddp $args | sed -n 's/^\[rank 0\] //p; /^{/p' | grep '^{' | tail -1)
z3=$("$ATOLL" launch --nproc-per-node 2 -- "$BENCH" zero3 $args | sed -n 's/^\[rank 0\] //p; /^{/p' | grep '^{' | tail -1)
tddp=$(/usr/bin/python3 tools/bench_torch_ddp.py ddp 2 $args 2>/dev/null | grep '^{' || echo '{}')
# torch 1.13's FSDP is made to import under Python 3.11 and to run on CPU/Gloo by
# tools/bench_torch_ddp.py (one unit per block; its gradient reduce-scatter is an all_reduce there,
# since 1.13's Gloo has no reduce-scatter); if it fails anyway the row says it did not run.
tfsdp=$(/usr/bin/python3 tools/bench_torch_ddp.py fsdp 2 $args 2>/dev/null | grep '^{' || echo '{}')
/usr/bin/python3 - "$L" "$C" "$B" "$T" "$one" "$ddp" "$z3" "$tddp" "$tfsdp" <<'PY'
import json, sys
L, C, B, T = sys.argv[1:5]
one, ddp, z3, tddp, tfsdp = (json.loads(a) for a in sys.argv[5:10])
mb = lambda r: r["peak_rss_bytes"] / 2**20
grew = lambda r: (r["peak_rss_bytes"] - r["base_rss_bytes"]) / 2**20  # above the process without the model
print(f"GPT L{L} C{C}, per-rank batch ({B},{T}), {one['params']/1e6:.2f}M parameters")
print(f"{'run':<22}{'step ms':>10}{'tok/s':>10}{'peak RSS/rank':>15}{'above start':>13}")
for name, r in [("atoll 1 rank", one), ("atoll DDP 2 ranks", ddp), ("atoll ZeRO-3 2 ranks", z3),
                ("torch DDP 2 ranks", tddp), ("torch FSDP 2 ranks", tfsdp)]:
    if r:
        print(f"{name:<22}{1e3*r['step_s']:10.1f}{r['tokens_per_s']:10.0f}{mb(r):13.0f}MB{grew(r):11.0f}MB")
    else:
        print(f"{name:<22}  (did not run)")
print(f"DDP scaling 2 vs 1 rank: {ddp['tokens_per_s']/one['tokens_per_s']:.2f}x tokens/s")
print(f"DDP communication hidden behind backward: {100*ddp['hidden_share']:.0f}% "
      f"(waited {1e3*ddp['comm_wait_s']:.1f} ms of {1e3*ddp['comm_alone_s']:.1f} ms, {ddp['buckets']} buckets); "
      f"median step {100*ddp['hidden_share_median']:.0f}% (waited {1e3*ddp['comm_wait_median_s']:.1f} ms)")
print(f"ZeRO-3 peak memory vs DDP: {mb(z3)/mb(ddp):.2f}x (above start {grew(z3)/grew(ddp):.2f}x); "
      f"step time {z3['step_s']/ddp['step_s']:.2f}x")
if tddp:
    print(f"step time atoll DDP / torch DDP: {ddp['step_s']/tddp['step_s']:.2f}")
if tfsdp:
    print(f"atoll ZeRO-3 / torch FSDP ({tfsdp.get('fsdp_units', '?')} units): step time "
          f"{z3['step_s']/tfsdp['step_s']:.2f}, peak memory {mb(z3)/mb(tfsdp):.2f} "
          f"(above start {grew(z3)/grew(tfsdp):.2f})")
PY
