#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the default model on the bundled
# default corpus (Debian's fortunes, prepared on first run). Extra arguments are config overrides,
# e.g. scripts/run.sh --train.steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
NPROC=${ATOLL_NPROC:-2}
if [ "$NPROC" -gt 1 ] && ./build/atoll launch --help >/dev/null 2>&1; then
  exec ./build/atoll launch --nproc-per-node "$NPROC" -- ./build/atoll train configs/default.toml "$@"
fi
exec ./build/atoll train configs/default.toml "$@"
