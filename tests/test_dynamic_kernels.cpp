// Kernels from a shared library loaded at run time: samples/custom_op's ops, built by
// opforge_add_ops into a module (tests/CMakeLists.txt), register themselves when the module is
// loaded with dlopen while two threads keep calling built-in ops and, once they appear, the new
// ones. The module's kernels resolve the Halide runtime and register_kernels in this executable.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

TEST(DynamicKernels, ModuleLoadedWithDlopenWhileTwoThreadsDispatch) {
  ASSERT_EQ(opforge::find_op("swish"), nullptr) << "the module's op is there before loading it";
  Tensor x = random({3, 257}, DType::Float32, Data::Normal, "dynamic/x");
  Tensor a = random({16}, DType::Float32, Data::Normal, "dynamic/a");
  std::vector<double> xv = x.to_double_vector(), av = a.to_double_vector();
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, swish_calls{0}, calls{0};
  auto dispatching = [&] {
    while (!stop.load()) {
      std::vector<double> c = opforge::mul(a, a).to_double_vector();
      for (size_t k = 0; k < c.size(); k++)
        if (float(c[k]) != float(av[k]) * float(av[k])) wrong++;
      calls++;
      if (!opforge::find_op("swish")) continue;
      std::vector<double> y = opforge::elementwise("swish", {x}).to_double_vector();
      for (size_t k = 0; k < y.size(); k++)
        if (std::abs(y[k] - xv[k] / (1 + std::exp(-xv[k]))) > 1e-5 * (1 + std::abs(y[k]))) wrong++;
      swish_calls++;
    }
  };
  std::thread t1(dispatching), t2(dispatching);
  while (calls.load() < 100) std::this_thread::yield();
  void* module = dlopen(OPFORGE_CUSTOM_OP_MODULE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(module, nullptr) << dlerror();
  while (swish_calls.load() < 50) std::this_thread::yield();
  stop = true;
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0);
  // Every op of the module is there, in every variant the build made for this CPU.
  for (const char* op : {"swish", "hard_tanh", "sum_squares"}) {
    const opforge::OpInfo* info = opforge::find_op(op);
    ASSERT_NE(info, nullptr) << op;
    EXPECT_GE(info->group("float32").variants.size(), 3u) << op;
  }
  std::vector<double> h = opforge::elementwise("hard_tanh", {x}, {0.5}).to_double_vector();
  for (size_t k = 0; k < h.size(); k++) ASSERT_EQ(h[k], std::fmin(std::fmax(xv[k], -0.5), 0.5));
  std::vector<double> s = opforge::reduction("sum_squares", x, {1}, false).to_double_vector();
  for (size_t row = 0; row < 3; row++) {
    double want = 0;
    for (size_t j = 0; j < 257; j++) want += xv[row * 257 + j] * xv[row * 257 + j];
    EXPECT_NEAR(s[row], want, 1e-5 * want);
  }
  // The module stays loaded: the registry keeps pointers into it for the process's lifetime.
}

}  // namespace
