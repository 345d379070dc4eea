#!/usr/bin/env bash
# Fuzzes each parser of outside input (fuzz/: config TOML, token shard headers, safetensors,
# checkpoint manifests, GPT-2 BPE files) with libFuzzer + ASan + UBSan for a bounded time, starting
# from the committed seed corpus, and prints one row per target: executions, seconds, exec/s,
# coverage, corpus size, peak memory and findings (crash/timeout/oom/leak files). New inputs go to
# $OUT/<target>/corpus, never into fuzz/corpus. Exit status 1 when anything was found.
# usage: bench/fuzz.sh [SECONDS_PER_TARGET (60)] [TARGET...]
# (configures and builds $BUILD, default build-fuzz, with clang++-14 -DATOLL_FUZZ=ON on first use)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
TARGETS=${*:-config shard_header safetensors checkpoint_manifest bpe_vocab}
BUILD=${BUILD:-build-fuzz}
OUT=${OUT:-$BUILD/fuzz-out}
CXX_FUZZ=${CXX_FUZZ:-clang++-14}
command -v "$CXX_FUZZ" >/dev/null || { echo "fuzz: $CXX_FUZZ not found (scripts/setup.sh installs clang-14 and libclang-rt-14-dev)"; exit 1; }
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$CXX_FUZZ" "${launcher[@]}" \
    -DATOLL_FUZZ=ON -DATOLL_FUZZ_CORPUS_TEST=OFF -DATOLL_CUDA=OFF -DATOLL_NATIVE=OFF >/dev/null
fi
cmake --build "$BUILD" -j"${JOBS:-2}" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) >/dev/null
echo "fuzz: ${SECS} s per target on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-20s %12s %7s %9s %7s %7s %8s %s\n' target execs secs exec/s cov corpus rss_mb findings
found=0
for t in $TARGETS; do
  dir=$OUT/$t
  rm -rf "$dir/artifacts"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  start=$(date +%s)
  rc=0
  "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" "fuzz/corpus/$t" >"$dir/log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$dir/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*' "$dir/log" | tail -1 | cut -d' ' -f2)
  n=$(find "$dir/artifacts" -type f | wc -l)
  what=$( [ "$n" -gt 0 ] && ls "$dir/artifacts" | tr '\n' ' ' || { [ "$rc" -ne 0 ] && echo "exit $rc, see $dir/log" || echo none; })
  [ "$n" -gt 0 ] || [ "$rc" -ne 0 ] && found=1
  printf '%-20s %12s %7s %9s %7s %7s %8s %s\n' "$t" "${execs:-?}" "$secs" "${rate:-?}" "${cov:-?}" "${corp:-?}" "${rss:-?}" "$what"
done
exit $found
