#!/usr/bin/env bash
# For a GPU machine that can neither install packages nor reach the network (the device machine
# lent to development sessions): packs the binaries built here, CUDA kernels included (building
# them needs no GPU), with the shared libraries they need beyond the C and C++ runtimes, into one
# archive; `tests/gpu/run.sh --prebuilt DIR` runs the GPU check from it there.
# Usage: tests/gpu/pack.sh [build-dir] [out-dir]   (defaults: build, .gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=${2:-.gpu}
cmake --build "$BUILD" --target opforge-cli opforge_tests
[[ $("$BUILD/bin/opforge" info) == *@cuda* ]] ||
  { echo "tests/gpu/pack.sh: $BUILD has no CUDA kernels (no CUDA toolkit under /usr/local/cuda?)" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$BUILD/bin/opforge" "$BUILD/bin/opforge_tests" "$stage/bin/"
strip --strip-unneeded "$stage/bin/"*
# Libraries the binaries link beyond libc, libm, libstdc++ and libgcc, which every Linux has.
ldd "$stage/bin/opforge" "$stage/bin/opforge_tests" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | sort -u |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
mkdir -p "$OUT"
tar -C "$stage" -cf - bin lib | xz -T0 -6 >"$OUT/opforge-gpu.tar.xz"
ls -la "$OUT/opforge-gpu.tar.xz"
