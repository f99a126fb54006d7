// The registry grows while it is used: kernels registered late (a library loaded at run time, a
// JIT) appear whole to threads that are dispatching at that moment, which take no lock to read it.
// The late ops here reuse a generated kernel (relu's) under new names, so calling them is a real
// kernel call whose result can be checked.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

TEST(RegistryGrowth, KernelsRegisteredWhileTwoThreadsDispatch) {
  const opforge::KernelGroup& relu = opforge::op_info("relu").group("float32");
  constexpr int kLate = 40;
  // The registry keeps pointers to its entries: they live as long as the process.
  static std::vector<std::string> names;
  static std::vector<opforge::KernelVariant> late;
  if (names.empty()) {
    for (int i = 0; i < kLate; i++) names.push_back("test_late_relu_" + std::to_string(i));
    for (int i = 0; i < kLate; i++)
      for (const auto& v : relu.variants) {
        if (v.kind != opforge::DeviceKind::cpu) continue;
        opforge::KernelVariant k = *v.kernel;
        k.op = names[size_t(i)].c_str();
        late.push_back(k);
      }
  }
  const size_t per_op = late.size() / kLate;
  Tensor x = random({5, 33}, DType::Float32, Data::Normal, "registry/x");
  Tensor a = random({8}, DType::Float32, Data::Normal, "registry/a");
  std::vector<double> xv = x.to_double_vector(), av = a.to_double_vector();
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, late_calls{0};
  auto dispatching = [&] {
    while (!stop.load()) {
      Tensor c = opforge::add(a, a);
      std::vector<double> cv = c.to_double_vector();
      for (size_t k = 0; k < cv.size(); k++)
        if (float(cv[k]) != float(av[k]) + float(av[k])) wrong++;
      for (const std::string& n : names) {
        if (!opforge::find_op(n)) continue;  // not registered yet
        std::vector<double> y = opforge::elementwise(n, {x}).to_double_vector();
        for (size_t k = 0; k < y.size(); k++)
          if (y[k] != std::max(xv[k], 0.0)) wrong++;
        late_calls++;
      }
    }
  };
  std::thread t1(dispatching), t2(dispatching);
  for (int i = 0; i < kLate; i++) {
    opforge::register_kernels(&late[size_t(i) * per_op], per_op);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(late_calls.load(), 0);
  for (const std::string& n : names) {
    const opforge::OpInfo* op = opforge::find_op(n);
    ASSERT_NE(op, nullptr) << n;
    EXPECT_EQ(op->group("float32").variants.size(), per_op) << n;
  }
  // The ops that were there before are untouched.
  EXPECT_EQ(&opforge::op_info("relu").group("float32"), &relu);
}

}  // namespace
