// The device API: discovery, queries, bad device names, and default-device scopes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;

bool has_opencl() {
  for (const auto& d : devices())
    if (d.device.kind == DeviceKind::opencl) return true;
  return false;
}

TEST(Device, TheCpuComesFirstAndParses) {
  ASSERT_FALSE(devices().empty());
  EXPECT_EQ(devices()[0].device, Device{});
  EXPECT_EQ(parse_device("cpu"), Device{});
  EXPECT_EQ(parse_device("cpu:0"), Device{});
  EXPECT_EQ(Device{}.str(), "cpu");
  EXPECT_GT(devices()[0].total_memory, 0u);
}

TEST(Device, BadNamesAreClearErrors) {
  for (const char* bad : {"cuda:7", "gpu:x", "tpu", "cpu:-1", "opencl:99",
                          "cuda:", "cpu:", "opencl:", "opencl:-1", "", ":0", "cpu:0x", "cuda: 0"}) {
    SCOPED_TRACE(bad);
    try {
      parse_device(bad);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("cpu"), std::string::npos) << m;  // lists what there is, or what is expected
    }
  }
}

TEST(Device, GpuCountAgreesWithAvailability) {
  EXPECT_EQ(gpu_is_available(), num_gpus() > 0);
  int cuda = 0;
  for (const auto& d : devices()) cuda += d.device.kind == DeviceKind::cuda;
  EXPECT_EQ(cuda, num_gpus());
}

TEST(Device, CpuCoresAndMemory) {
  EXPECT_GE(num_cpu_cores(true), num_cpu_cores(false));
  EXPECT_GE(num_cpu_cores(false), 1);
  Device cpu;
  uint64_t total = total_mem_on_dev(cpu), used = used_mem_on_dev(cpu),
           mine = used_mem_on_dev(cpu, true);
  EXPECT_GT(used, 0u);
  EXPECT_LT(used, total);
  EXPECT_GT(mine, 0u);
  EXPECT_LT(mine, total);
  double pct = percent_used_mem_on_dev(cpu);
  EXPECT_GT(pct, 0);
  EXPECT_LT(pct, 100);
  // A large resident tensor shows up in the process's own figure.
  uint64_t before = used_mem_on_dev(cpu, true);
  Tensor big = Tensor::ones({64 << 20}, DType::Float32);  // 256 MB, written
  EXPECT_GT(used_mem_on_dev(cpu, true), before + (128u << 20));
}

TEST(Device, CpuUtilizationRisesUnderLoad) {
  std::atomic<bool> stop{false};
  std::thread spin([&] {
    volatile uint64_t x = 0;
    while (!stop) x = x + 1;
  });
  double u = dev_util(Device{});
  stop = true;
  spin.join();
  EXPECT_GT(u, 5.0);
  EXPECT_LE(u, 100.0);
}

TEST(Device, DefaultDeviceScopesNest) {
  EXPECT_EQ(default_device(), Device{});
  Device other = has_opencl() ? Device{DeviceKind::opencl, 0} : Device{};
  {
    DefaultDevice outer(other);
    EXPECT_EQ(default_device(), other);
    {
      DefaultDevice inner("cpu");
      EXPECT_EQ(default_device(), Device{});
    }
    EXPECT_EQ(default_device(), other);
  }
  EXPECT_EQ(default_device(), Device{});
  EXPECT_THROW(unset_default_device(), Error);
  EXPECT_THROW(DefaultDevice("cuda:7"), Error);
  EXPECT_EQ(default_device(), Device{});
}

TEST(Device, AScopeRestoresTheStackWhateverWasSetOrUnsetInside) {
  Device other = has_opencl() ? Device{DeviceKind::opencl, 0} : Device{};
  set_default_device(other);
  {
    DefaultDevice scope("cpu");
    unset_default_device();  // pops the scope's own entry
    unset_default_device();  // and the one set before it
    EXPECT_FALSE(default_device_is_set());
  }  // must neither throw nor pop anything more
  EXPECT_FALSE(default_device_is_set());
  {
    DefaultDevice scope("cpu");
    set_default_device(other);
    set_default_device(other);
  }
  EXPECT_FALSE(default_device_is_set()) << "entries set inside a scope leave with it";
}

TEST(Device, OpenClDevicesReportMemoryAndUtilization) {
  if (!has_opencl()) GTEST_SKIP() << "no OpenCL ICD on this machine";
  Device d{DeviceKind::opencl, 0};
  EXPECT_EQ(parse_device("opencl:0"), d);
  EXPECT_GT(total_mem_on_dev(d), 0u);
  // OpenCL has no usage query: what this process holds there, nothing between calls.
  EXPECT_EQ(used_mem_on_dev(d), 0u);
  EXPECT_EQ(used_mem_on_dev(d, true), 0u);
  // Utilization is the share of time its queue runs calls: busy while a stream of calls runs.
  Tensor a = Tensor::rand({256, 256}), b = Tensor::rand({256, 256});
  std::atomic<bool> stop{false};
  std::thread load([&] {
    DefaultDevice scope(d);
    while (!stop) matmul(a, b);
    synchronize();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the kernel's first build
  double busy = dev_util(d);
  stop = true;
  load.join();
  EXPECT_GT(busy, 20.0);
  EXPECT_LE(busy, 100.0);
}

TEST(Device, FunctionSupportedDevices) {
  // The kinds of device the build has kernels for, whether or not this machine has one.
  std::vector<std::string> kinds = function_supported_devices("add");
  ASSERT_GE(kinds.size(), 2u);
  EXPECT_EQ(kinds[0], "cpu");
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "opencl"), kinds.end());
  EXPECT_THROW(function_supported_devices("no_such_op"), Error);
}

}  // namespace
