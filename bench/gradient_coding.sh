#!/usr/bin/env bash
# Gradient coding with a straggler (issue 14 item 5; docs/fault_tolerance.md): N ranks of the
# least-squares toy of tests/resilience/test_pipelined_gc.cpp (`test_resilience --rank-program
# pgc`), each partition gradient standing in for WORK_MS of a model's forward and backward (a
# sleep, so that 2 loaded cores do not stretch it: the figures are about the coordination, not the
# arithmetic). One rank (2) delayed DELAY_MS per step it computes. Schemes:
#   pipelined  one partition per worker per step, decode from any n - s (coded_data_parallel.h)
#   plain      plain gradient coding: s + 1 partitions per worker per step, decode from any n - s
#   ignore     one partition per worker, the first n - s messages summed (the straggler's data lost)
#   uncoded    one partition per worker, wait for all n (plain data parallelism)
# Prints, per scheme, the median over the fast ranks of their median step time, the run's wall
# time, rank 0's time to reach TARGET loss, and the final loss; every configuration REPEAT times,
# alternated. No PyTorch peer: PyTorch has no gradient coding; the baselines are these schemes.
# Usage: bench/gradient_coding.sh [BUILD_DIR]  (env: N=4 S=1 CODE=fractional STEPS=60 WORK_MS=100
#        DELAY_MS=500 TARGET=0.0085 LR=20 REPEAT=2)
set -euo pipefail
BUILD=${1:-build}
A=$(realpath "$BUILD/atoll")
T=$(realpath "$BUILD/tests/resilience/test_resilience")
N=${N:-4} S=${S:-1} CODE=${CODE:-fractional} STEPS=${STEPS:-60} WORK_MS=${WORK_MS:-100}
DELAY_MS=${DELAY_MS:-500} TARGET=${TARGET:-0.0085} LR=${LR:-20} REPEAT=${REPEAT:-2}
W=$(mktemp -d /tmp/atoll_gcbench.XXXX)
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "n=$N s=$S code=$CODE steps=$STEPS work=${WORK_MS} ms/partition (sleep) straggler: rank 2 +${DELAY_MS} ms/step target loss $TARGET"
run() {  # name scheme delay
  PGC_SCHEME=$2 PGC_CODE=$CODE PGC_S=$S PGC_STEPS=$STEPS PGC_WORK_MS=$WORK_MS PGC_WORK_KIND=sleep PGC_LR=$LR \
    PGC_DELAY_RANK=2 PGC_DELAY_MS=$3 PGC_TARGET=$TARGET OMP_NUM_THREADS=1 \
    "$A" launch --nproc-per-node "$N" -- "$T" --rank-program pgc >> "$W/$1.log" 2>&1
}
CONFIGS="pipelined:0 pipelined:$DELAY_MS plain:$DELAY_MS ignore:$DELAY_MS uncoded:$DELAY_MS"
for rep in $(seq "$REPEAT"); do
  for c in $CONFIGS; do run "${c%%:*}_${c##*:}" "${c%%:*}" "${c##*:}"; done
done
python3 - "$W" $CONFIGS <<'PY'
import re, statistics, sys
w = sys.argv[1]
rows = {}
for c in sys.argv[2:]:
    name = c.replace(":", "_")
    txt = open(f"{w}/{name}.log").read()
    # one block of N rank lines per repeat: the fast ranks' medians (rank 2 is the straggler)
    fast = [float(m.group(2)) for m in re.finditer(r"pgc: rank (\d+): .*?median step ([\d.]+) ms", txt) if m.group(1) != "2"]
    wall = [float(x) for x in re.findall(r"pgc: rank 0: .*?total ([\d.]+) s", txt)]
    ttl = [float(x) for x in re.findall(r"time to loss [\d.e-]+: ([-\d.]+) s", txt)]
    loss = [float(x) for x in re.findall(r"pgc: rank 0: .*?final loss ([\d.e-]+)", txt)]
    rows[c] = (statistics.median(fast), statistics.median(wall), ttl, statistics.median(loss))
base = rows[sys.argv[2]][0]
print(f"{'scheme:delay_ms':22} {'step ms (fast ranks)':>21} {'x coded no-straggler':>21} {'wall s':>7} {'time to loss s (each run)':>27} {'final loss':>11}")
for c, (st, wall, ttl, loss) in rows.items():
    t = ", ".join("not reached" if x < 0 else f"{x:.2f}" for x in ttl)
    print(f"{c:22} {st:21.1f} {st / base:21.3f} {wall:7.2f} {t:>27} {loss:11.6f}")
PY
