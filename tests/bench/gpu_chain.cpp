// A chain of small adds on opencl:0 (PoCL here), timed from the first call to synchronize():
// what asynchronous GPU kernels save per call. Build target gpu_chain_bench; see RESULTS.md.
#include <chrono>
#include <cstdio>

#include "opforge/opforge.hpp"
using namespace opforge;
int main() try {
  Generator gen(1);
  DefaultDevice on(Device{DeviceKind::opencl, 0});
  for (int64_t n : {int64_t(1) << 10, int64_t(1) << 16, int64_t(1) << 20}) {
    Tensor x = Tensor::rand({n}, DType::Float32, gen).to(Device{DeviceKind::opencl, 0});
    Tensor y = x;
    for (int i = 0; i < 300; i++) y = add(y, x);  // calibrate
    synchronize();
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 500; i++) y = add(y, x);
      synchronize();
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("n=%lld: %.1f us per chained add on opencl:0 (best of 5)\n", (long long)n,
                best / 500 * 1e6);
  }
} catch (const opforge::Error& e) {
  std::fprintf(stderr, "gpu_chain_bench: %s\n", e.what());
  return 1;
}
