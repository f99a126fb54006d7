#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: builds opforge with its CUDA kernels, runs the whole
# test suite with cuda:0 present (every op's CUDA variants against the float64 reference, CUDA next
# to the CPU and OpenCL devices, GPU-resident tensors), times matmul and add on cuda:0 against cuBLAS
# and cudaMemcpy, and prints the devices and the time of each CUDA variant test.
# Record its output in tests/bench/RESULTS.md. Usage: tests/gpu/run.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}

if ! nvidia-smi -L; then
  echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi failed)" >&2
  exit 2
fi
if [ ! -e /usr/local/cuda/include/cuda.h ]; then
  echo "tests/gpu/run.sh: no CUDA toolkit under /usr/local/cuda: the build would make no CUDA kernels" >&2
  exit 2
fi

scripts/install-deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPFORGE_CUDA_KERNELS=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
"$BUILD"/bin/opforge info | head -8
"$BUILD"/bin/opforge info --load

# opforge's CUDA kernels against cuBLAS sgemm and the device's copy bandwidth, operands resident.
"$BUILD"/bin/opforge bench --filter '^cuda_'

# The CUDA variant tests first, with their times, then everything.
"$BUILD"/bin/opforge_tests --gtest_filter='*_cuda' \
  --gtest_print_time=1 | grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|PASSED|FAILED' || true
(cd "$BUILD" && ctest -j "$(nproc)" --output-on-failure --timeout 900)
