// Calls placed on an OpenCL device (PoCL here): they run on that device's queue, in order with
// calls on the CPU that produce or consume the same tensors. Every op's OpenCL variants are checked
// against the float64 reference in test_variants.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;

const Device kOpenCl{DeviceKind::opencl, 0};

TEST(OpenCl, ChainsBetweenCpuAndOpenClSeeTheirInputs) {
  if (!device_exists(kOpenCl)) GTEST_SKIP() << "no OpenCL device on this machine";
  Generator g(21);
  Tensor x = Tensor::rand({4099}, DType::Float32, g);
  std::vector<float> xv = x.to_vector<float>();
  Tensor y, z;
  for (int round = 0; round < 5; round++) {
    {
      DefaultDevice scope(kOpenCl);
      y = add(mul(x, 2.0), 1.0);  // queued on opencl:0
    }
    z = sub(y, x);  // on the CPU: waits for y
    {
      DefaultDevice scope(kOpenCl);
      z = relu(z);  // back on opencl:0, reading what the CPU wrote
    }
  }
  std::vector<float> zv = z.to_vector<float>();
  for (size_t i = 0; i < xv.size(); i++) ASSERT_FLOAT_EQ(zv[i], xv[i] + 1.0f) << i;
  int64_t on_opencl = 0;
  for (const auto& s : dispatch_stats())
    if (s.device == kOpenCl) on_opencl += s.calls;
  EXPECT_GE(on_opencl, 15);
}

TEST(OpenCl, NoKernelForThePinnedDeviceIsAClearError) {
  if (!device_exists(kOpenCl)) GTEST_SKIP() << "no OpenCL device on this machine";
  Tensor a = Tensor::rand({8}), b = Tensor::rand({8});
  force_variant("manual");  // a CPU variant: nothing to run on opencl:0
  try {
    DefaultDevice scope(kOpenCl);
    add(a, b);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opencl:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("manual"), std::string::npos) << e.what();
  }
  force_variant("");
}

TEST(OpenCl, AutomaticPlacementLeavesAnOpenClDeviceOnTheCpuCoresAlone) {
  if (!device_exists(kOpenCl)) GTEST_SKIP() << "no OpenCL device on this machine";
  if (const char* v = std::getenv("OPFORGE_AUTO_CPU_OPENCL"); v && std::string(v) == "1")
    GTEST_SKIP() << "OPFORGE_AUTO_CPU_OPENCL=1 puts it in automatic placement";
  bool on_cpu_cores = false;
  for (const auto& d : devices())
    if (d.device == kOpenCl) on_cpu_cores = d.shares_cpu_cores;
  if (!on_cpu_cores) GTEST_SKIP() << "opencl:0 is a GPU: automatic placement may use it";
  auto calls_on_opencl = [] {
    int64_t n = 0;
    for (const auto& s : dispatch_stats())
      if (s.device == kOpenCl) n += s.calls;
    return n;
  };
  int64_t before = calls_on_opencl();
  Tensor a = Tensor::rand({64, 64});
  for (int i = 0; i < 20; i++) a = tanh(matmul(a, a));
  synchronize();
  EXPECT_EQ(calls_on_opencl(), before);
}

}  // namespace
