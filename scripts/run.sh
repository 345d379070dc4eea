#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the default model on the bundled
# default corpus (Debian's fortunes, prepared on first run). Extra arguments are config overrides,
# e.g. scripts/run.sh --train.steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# A second run of the main job starts a fresh run and moves the previous one aside into
# runs/default/old-<time>/ (nothing is deleted); pass --resume to continue an interrupted one.
ARGS=("$@")
case " $* " in *" --resume "*|*" --overwrite "*) ;; *) ARGS+=(--overwrite) ;; esac
set -- "${ARGS[@]}"
NPROC=${ATOLL_NPROC:-2}
if [ "$NPROC" -gt 1 ] && ./build/atoll launch --help >/dev/null 2>&1; then
  exec ./build/atoll launch --nproc-per-node "$NPROC" -- ./build/atoll train configs/default.toml "$@"
fi
exec ./build/atoll train configs/default.toml "$@"
