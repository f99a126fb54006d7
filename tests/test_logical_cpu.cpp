// Logical CPU devices. These tests need OPFORGE_CPU_DEVICES set before the process starts; ctest
// runs them in their own process with OPFORGE_CPU_DEVICES="0;1" (tests/CMakeLists.txt), and they
// skip in the main run.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;

bool configured() { return !device_stats().empty(); }

int64_t tasks_of(int index) {
  for (const auto& s : device_stats())
    if (s.device.index == index) return s.tasks;
  return -1;
}

TEST(LogicalCpu, DevicesFollowTheEnvironment) {
  if (!configured()) GTEST_SKIP() << "OPFORGE_CPU_DEVICES is not set";
  int cpus = 0;
  for (const auto& d : devices()) cpus += d.device.kind == DeviceKind::cpu;
  EXPECT_EQ(cpus, int(device_stats().size()));
  EXPECT_EQ(parse_device("cpu:1").index, 1);
  EXPECT_EQ(Device{}.str(), "cpu:0");
  EXPECT_THROW(parse_device("cpu:9"), Error);
}

TEST(LogicalCpu, KernelsRunOnTheDefaultDevicesCoresOnly) {
  if (!configured() || device_stats().size() < 2) GTEST_SKIP() << "needs two logical CPU devices";
  Generator g(11);
  Tensor a = Tensor::randn({256, 256}, DType::Float32, g),
         b = Tensor::randn({256, 256}, DType::Float32, g);
  Tensor want = matmul(a, b);  // on cpu:0, the default
  int64_t t0 = tasks_of(0), t1 = tasks_of(1);
  Tensor got;
  {
    DefaultDevice scope("cpu:1");
    for (int i = 0; i < 5; i++) got = matmul(a, b);
  }
  EXPECT_GT(tasks_of(1), t1);
  EXPECT_EQ(tasks_of(0), t0);
  for (const auto& s : device_stats()) EXPECT_EQ(s.foreign_core_tasks, 0) << s.device.str();
  EXPECT_EQ(got.to_double_vector(), want.to_double_vector());
}

TEST(LogicalCpu, UtilizationIsThePoolsBusyTime) {
  if (!configured() || device_stats().size() < 2) GTEST_SKIP() << "needs two logical CPU devices";
  std::atomic<bool> stop{false};
  std::thread load([&] {
    DefaultDevice scope("cpu:1");
    Tensor a = Tensor::randn({512, 512}), b = Tensor::randn({512, 512});
    while (!stop) matmul(a, b);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double busy = dev_util(parse_device("cpu:1"));
  double idle = dev_util(parse_device("cpu:0"));
  stop = true;
  load.join();
  EXPECT_GT(busy, 20.0);
  EXPECT_LT(idle, 5.0);
}

}  // namespace
