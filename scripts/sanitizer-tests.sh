#!/usr/bin/env bash
# The runtime's own tests under AddressSanitizer with UndefinedBehaviorSanitizer, then under
# ThreadSanitizer: each a separate build of the runtime and those tests that links the kernels a
# finished build generated (OPFORGE_PREBUILT_KERNELS), so no kernel is compiled again. Any report
# fails the test that caused it (halt_on_error), and so this script.
#   scripts/sanitizer-tests.sh [BUILD]   (BUILD: the finished build, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=${JOBS:-$(nproc)}
kernels=$(cd "$build/kernels" && pwd)
# use_sigaltstack=0: GCC 12's ASan cannot unmap its per-thread signal stack at thread exit on this
# kernel (6.x) and aborts; the stack only serves reports of stack overflows.
# intercept_tls_get_addr=0: up to GCC 13 the sanitizer runtime can take a dynamic TLS block (here
# PoCL's, loaded with dlopen) for a pre-2.25 glibc header by the coincidence of its address
# modulo 4096, and LeakSanitizer's tracer then crashes at exit after the test passed
# (google/sanitizers#1322). Leaks are still checked; dynamic TLS is then not scanned (the
# runtime's thread_locals are static TLS).
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:use_sigaltstack=0:intercept_tls_get_addr=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(pwd)/tests/sanitizers/tsan.supp
# -O1 -g1 (line tables): what the sanitizers' documentation recommends for readable reports, and
# half the compile time of RelWithDebInfo's -O2 -g on a fresh machine (45 s -> 20 s for
# test_errors.cpp under ASan), which counts against make test's 45 minutes.
for sanitizer in address,undefined thread; do
  dir=$build-sanitize-${sanitizer%%,*}
  start=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DOPFORGE_SANITIZE=$sanitizer \
        -DOPFORGE_PREBUILT_KERNELS="$kernels" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest -j "$jobs" --output-on-failure --timeout 600)
  echo "sanitizer-tests: $sanitizer: built and passed in $(( $(date +%s) - start )) s"
done
