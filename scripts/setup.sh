#!/usr/bin/env bash
# Installs the Debian packages atoll needs. Idempotent: packages already present are skipped,
# and apt is not touched at all when everything is there.
set -euo pipefail
PKGS=(
  build-essential cmake g++ pkg-config
  libopenblas-dev libopenblas0-openmp libomp-dev libdnnl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libgloo-dev libopenmpi-dev openmpi-bin
  python3 python3-torch python3-numpy
  fortunes fortunes-min bible-kjv bible-kjv-text dict-gcide wamerican
  clang-14 libclang-rt-14-dev
  iproute2
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
