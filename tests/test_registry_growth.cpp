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

// A group takes any number of variants (variant sets grow past one 64-bit word): 100 copies of
// relu's CPU kernel registered at run time as variants of one op. Each of several forced by name
// runs (dispatch_stats counts it) and gives relu; unforced, every variant is timed in the
// calibration, the ones past 64 too, and the results stay right.
TEST(RegistryGrowth, AGroupTakesMoreThan64Variants) {
  const opforge::KernelGroup& relu = opforge::op_info("relu").group("float32");
  const opforge::VariantInfo* cpu = nullptr;
  for (const auto& v : relu.variants)
    if (v.kind == opforge::DeviceKind::cpu && v.name == "manual") cpu = &v;
  ASSERT_NE(cpu, nullptr);
  constexpr int kVariants = 100;
  const char* op = "test_many_variants_relu";
  static std::vector<std::string> names;
  static std::vector<opforge::KernelVariant> many;
  if (many.empty()) {
    for (int i = 0; i < kVariants; i++) names.push_back("v" + std::to_string(i));
    for (int i = 0; i < kVariants; i++) {
      opforge::KernelVariant k = *cpu->kernel;
      k.op = op;
      k.variant = names[size_t(i)].c_str();
      k.dense_argv = nullptr;  // every call takes the strided kernel, whichever variant it is
      many.push_back(k);
    }
    opforge::register_kernels(many.data(), many.size());
  }
  ASSERT_EQ(opforge::op_info(op).group("float32").variants.size(), size_t(kVariants));
  Tensor x = random({5, 33}, DType::Float32, Data::Normal, "registry/many x");
  std::vector<double> xv = x.to_double_vector();
  auto check = [&](const Tensor& y) {
    std::vector<double> yv = y.to_double_vector();
    ASSERT_EQ(yv.size(), xv.size());
    for (size_t k = 0; k < yv.size(); k++) EXPECT_EQ(yv[k], std::max(xv[k], 0.0)) << k;
  };
  auto calls_of = [&](const std::string& variant) {
    int64_t n = 0;
    for (const auto& s : opforge::dispatch_stats())
      if (s.op == op && s.variant == variant) n += s.calls;
    return n;
  };
  for (int i : {0, 63, 64, 65, 99}) {
    SCOPED_TRACE(names[size_t(i)]);
    int64_t before = calls_of(names[size_t(i)]);
    opforge::force_variant(names[size_t(i)], op);
    check(opforge::elementwise(op, {x}));
    opforge::force_variant("");
    EXPECT_EQ(calls_of(names[size_t(i)]), before + 1);
  }
  opforge::reset_performance_model();
  // Calibration times every variant at least once (one far slower than the best, by the noise of
  // a microsecond call, is given up after its first run).
  std::vector<int64_t> before;
  for (int i = 0; i < kVariants; i++) before.push_back(calls_of(names[size_t(i)]));
  auto all_timed = [&] {
    for (int i = 0; i < kVariants; i++)
      if (calls_of(names[size_t(i)]) == before[size_t(i)]) return false;
    return true;
  };
  // Each CPU device calibrates every variant (two logical devices in ops_on_two_logical_devices).
  const int runs = opforge::DispatchPolicy{}.calibration_runs;
  for (int c = 0; c < 4 * runs * kVariants && !(c % 50 == 0 && all_timed()); c++)
    check(opforge::elementwise(op, {x}));
  for (int i = 0; i < kVariants; i++)
    EXPECT_GT(calls_of(names[size_t(i)]), before[size_t(i)])
        << names[size_t(i)] << " was not calibrated";
}

}  // namespace
