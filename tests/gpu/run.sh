#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: builds opforge with its CUDA kernels, runs the whole
# test suite with cuda:0 present (every op's CUDA variants against the float64 reference, CUDA next
# to the CPU and OpenCL devices, GPU-resident tensors), times matmul and add on cuda:0 against cuBLAS
# and cudaMemcpy, and prints the devices and the time of each CUDA variant test.
# Record its output in tests/bench/RESULTS.md.
# Usage: tests/gpu/run.sh [build-dir]
#        tests/gpu/run.sh --prebuilt DIR   (no build: runs what tests/gpu/pack.sh packed into DIR,
#                                           for a GPU machine without packages or network)
# On the development sessions' device machine: run tests/gpu/pack.sh here (it writes .gpu/), then
# there, carrying .gpu: `tests/gpu/run.sh --prebuilt .gpu 2>&1 | tee $OUT/gpu.log` (about 3 min).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! nvidia-smi -L; then
  echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi failed)" >&2
  exit 2
fi

if [ "${1:-}" = --prebuilt ]; then
  root=$(mktemp -d)
  tar -C "$root" -xJf "${2:?tests/gpu/run.sh --prebuilt DIR}/opforge-gpu.tar.xz"
  export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  BIN=$root/bin
else
  if [ ! -e /usr/local/cuda/include/cuda.h ]; then
    echo "tests/gpu/run.sh: no CUDA toolkit under /usr/local/cuda: the build would make no CUDA kernels" >&2
    exit 2
  fi
  BUILD=${1:-build-gpu}
  scripts/install-deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPFORGE_CUDA_KERNELS=ON >/dev/null
  cmake --build "$BUILD" -j "$(nproc)"
  BIN=$BUILD/bin
fi

"$BIN"/opforge info | sed -n 1,8p  # sed reads it all: no SIGPIPE under pipefail
"$BIN"/opforge info --load

# opforge's CUDA kernels against cuBLAS sgemm and the device's copy bandwidth, operands resident.
# Each step below runs whatever the one before did; any failure makes the script fail.
status=0
"$BIN"/opforge bench --filter '^cuda_' || status=1

# The CUDA tests first, with their times, then everything.
"$BIN"/opforge_tests --gtest_filter='*_cuda:*GpuTensors*/cuda:Device.*' --gtest_print_time=1 \
  --gtest_brief=1 || status=1
"$BIN"/opforge_tests --gtest_brief=1 || status=1
# Automatic placement with the GPU next to two logical CPU devices: every op again.
half=$(($(nproc) / 2))
OPFORGE_CPU_DEVICES="0-$((half - 1));$half-$((2 * half - 1))" "$BIN"/opforge_tests --gtest_brief=1 \
  --gtest_filter='-Device.*:LogicalCpu.*:*_opencl:*_cuda' || status=1
if [ -n "${BUILD:-}" ]; then
  (cd "$BUILD" && ctest -j "$(nproc)" --output-on-failure --timeout 900) || status=1
fi
exit $status
