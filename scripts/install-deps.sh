#!/usr/bin/env bash
# Installs the Debian packages opforge builds and tests with; quiet and idempotent: only missing
# packages are installed. Runs apt-get as root, or through sudo when there is one.
set -euo pipefail
packages=(
  cmake ninja-build g++ ccache pkg-config make
  libhalide14-0-dev llvm-14-dev libboost-dev librange-v3-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libdnnl-dev libtorch-dev
  pocl-opencl-icd ocl-icd-opencl-dev zlib1g-dev libplplot-dev dataset-fashion-mnist
  libopenmpi-dev openmpi-bin
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
