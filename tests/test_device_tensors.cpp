// Tensors that live on a GPU device (opencl:0 on PoCL in every test run; cuda:0 on a machine with
// an NVIDIA GPU): to_device and back, ops that run where their inputs live and leave results there,
// views at any offset, host writes, soft device mode and the mixed-device error, and the caching
// allocator with its out-of-memory error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace opforge;

class GpuTensors : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    d_ = Device{GetParam() == "cuda" ? DeviceKind::cuda : DeviceKind::opencl, 0};
    if (!device_exists(d_)) GTEST_SKIP() << "no " << d_.str() << " on this machine";
  }
  int64_t calls_on_device() const {
    int64_t n = 0;
    for (const auto& s : dispatch_stats())
      if (s.device == d_) n += s.calls;
    return n;
  }
  uint64_t bytes_to_device() const {
    for (const auto& s : device_stats())
      if (s.device == d_) return s.bytes_to_device;
    return 0;
  }
  Device d_;
};

TEST_P(GpuTensors, ToDeviceAndBack) {
  Generator g(3);
  Tensor x = Tensor::randn({33, 65}, DType::Float32, g);
  uint64_t before = memory_allocated(d_);
  Tensor y = to_device(x, d_);
  EXPECT_EQ(y.device(), d_);
  EXPECT_EQ(x.device().kind, DeviceKind::cpu);
  EXPECT_GE(memory_allocated(d_), before + 33 * 65 * 4);
  EXPECT_EQ(y.to(d_).storage(), y.storage()) << "moving to where it lives is a no-op";
  Tensor back = y.cpu();
  EXPECT_EQ(back.device().kind, DeviceKind::cpu);
  EXPECT_EQ(back.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>()) << "host reads copy back";
  // A non-contiguous view moves as its elements.
  Tensor t = to_device(x.transpose(0, 1), d_);
  EXPECT_EQ(t.shape(), (Shape{65, 33}));
  EXPECT_EQ(t.to_vector<float>(), x.transpose(0, 1).contiguous().to_vector<float>());
}

TEST_P(GpuTensors, OpsRunWhereTheirInputsLiveAndLeaveResultsThere) {
  Generator g(4);
  Tensor a = Tensor::rand({64, 48}, DType::Float32, g),
         b = Tensor::rand({48, 40}, DType::Float32, g);
  Tensor c = Tensor::rand({64, 40}, DType::Float32, g);
  Tensor ad = to_device(a, d_), bd = to_device(b, d_), cd = to_device(c, d_);
  int64_t calls = calls_on_device();
  Tensor r = relu(sub(matmul(ad, bd), mul(cd, 2.0)));  // no default device: inferred from inputs
  Tensor s = sum(r, {1});
  EXPECT_EQ(r.device(), d_);
  EXPECT_EQ(s.device(), d_);
  EXPECT_GE(calls_on_device() - calls, 5);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(),
                     cv = c.to_vector<float>();
  std::vector<float> sv = s.to_vector<float>();
  for (int i = 0; i < 64; i++) {
    double row = 0;
    for (int j = 0; j < 40; j++) {
      double m = 0;
      for (int k = 0; k < 48; k++) m += double(av[size_t(i * 48 + k)]) * bv[size_t(k * 40 + j)];
      row += std::max(0.0, m - 2.0 * cv[size_t(i * 40 + j)]);
    }
    ASSERT_NEAR(sv[size_t(i)], row, 1e-4 * (1 + std::abs(row))) << i;
  }
}

TEST_P(GpuTensors, ViewsAtAnyOffset) {
  Generator g(5);
  Tensor x = Tensor::rand({37, 64}, DType::Float32, g);
  Tensor xd = to_device(x, d_);
  // Offsets of 3 and 64 elements (12 and 256 bytes: below and a multiple of OpenCL's usual
  // sub-buffer alignment), and a transposed view.
  std::vector<std::function<Tensor(const Tensor&)>> views = {
      [](const Tensor& t) { return t.slice(1, 3, 40); },
      [](const Tensor& t) { return t.slice(0, 1, 36); },
      [](const Tensor& t) { return t.slice(0, 2, 30).transpose(0, 1); }};
  for (const auto& view : views) {
    Tensor r = add(view(xd), 1.5);
    EXPECT_EQ(r.device(), d_);
    std::vector<double> rv = r.to_double_vector(), want = view(x).to_double_vector();
    ASSERT_EQ(rv.size(), want.size());
    for (size_t i = 0; i < want.size(); i++)
      ASSERT_FLOAT_EQ(float(rv[i]), float(want[i] + 1.5)) << i;
  }
  // Writing into a view of a GPU tensor leaves the rest of it as it was.
  Tensor dst = to_device(Tensor::full({10, 10}, -1.0), d_);
  Tensor src = to_device(Tensor::rand({8, 7}, DType::Float32, g), d_);
  copy_into(dst.slice(0, 1, 9).slice(1, 2, 9), src);
  EXPECT_EQ(dst.device(), d_);
  std::vector<float> dv = dst.to_vector<float>(), sv = src.to_vector<float>();
  for (int i = 0; i < 10; i++)
    for (int j = 0; j < 10; j++) {
      bool inside = i >= 1 && i < 9 && j >= 2 && j < 9;
      float want = inside ? sv[size_t((i - 1) * 7 + j - 2)] : -1.0f;
      ASSERT_EQ(dv[size_t(i * 10 + j)], want) << i << "," << j;
    }
}

TEST_P(GpuTensors, AStridedOutputSpanningItsStorageKeepsTheElementsItSkips) {
  // Columns 0 and 2 of a 3x3 host tensor: the view starts at byte 0 and ends at the last byte.
  Tensor x = Tensor::zeros({3, 3});
  Tensor y = to_device(Tensor::ones({3, 2}), d_);
  copy_into(x.slice(1, 0, 3, 2), y);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 0, 1, 1, 0, 1, 1, 0, 1}));
}

TEST_P(GpuTensors, EmptyAndConstantResultsStayOnTheDevice) {
  Tensor e = to_device(Tensor::empty({0, 3}), d_);
  EXPECT_EQ(relu(e).device(), d_);
  Tensor s = sum(e, {0});
  EXPECT_EQ(s.device(), d_);
  EXPECT_EQ(s.to_vector<float>(), std::vector<float>(3, 0.0f));
}

TEST_P(GpuTensors, CopiesBackWhateverTheDefaultDevice) {
  Tensor x = Tensor::rand({5, 7});
  Tensor t = to_device(x, d_).transpose(0, 1);  // not contiguous: the copy runs on the device
  DefaultDevice scope(Device{});
  EXPECT_EQ(t.cpu().to_vector<float>(), x.transpose(0, 1).contiguous().to_vector<float>());
  EXPECT_EQ(t.to_vector<float>(), x.transpose(0, 1).contiguous().to_vector<float>());
}

TEST_P(GpuTensors, HostWritesAreSeenByTheNextGpuCall) {
  Tensor y = to_device(Tensor::full({1000}, 1.0), d_);
  y.data_ptr<float>()[7] = 42.0f;  // host write to a GPU tensor: its device copy goes stale
  EXPECT_EQ(add(y, 0.0).to_vector<float>()[7], 42.0f);
  // A host tensor a GPU call used is cached there; writing it on the host drops that copy.
  Tensor x = Tensor::full({1000}, 2.0);
  {
    DefaultDevice scope(d_);
    EXPECT_EQ(mul(x, 3.0).to_vector<float>()[5], 6.0f);
    x.data_ptr<float>()[5] = 10.0f;
    EXPECT_EQ(mul(x, 3.0).to_vector<float>()[5], 30.0f);
  }
  EXPECT_EQ(x.device().kind, DeviceKind::cpu);
}

TEST_P(GpuTensors, MixedDevicesAreAnErrorUnlessSoftModeMovesThem) {
  Tensor a = to_device(Tensor::full({16}, 3.0), d_);
  Tensor b = Tensor::full({16}, 4.0);
  EXPECT_EQ(add(a, b).device(), d_) << "host tensors are moved to where the GPU input lives";
  ASSERT_FALSE(soft_device_mode());
  std::string err = ref::error_message([&] {
    DefaultDevice scope(Device{});
    add(a, b);
  });
  EXPECT_NE(err.find(d_.str()), std::string::npos) << err;
  EXPECT_NE(err.find("set_soft_device_mode(true)"), std::string::npos) << err;
  set_soft_device_mode(true);
  {
    DefaultDevice scope(Device{});
    Tensor c = add(a, b);
    EXPECT_EQ(c.device().kind, DeviceKind::cpu) << "soft mode runs it on the default device";
    EXPECT_EQ(c.to_vector<float>(), std::vector<float>(16, 7.0f));
  }
  set_soft_device_mode(false);
}

TEST_P(GpuTensors, TheAllocatorCachesAndRunsOutOfMemoryWithAClearError) {
  synchronize();
  empty_cache(d_);
  uint64_t base = memory_allocated(d_);
  EXPECT_EQ(memory_reserved(d_), base);
  {
    Tensor big = to_device(Tensor::ones({1 << 20}), d_);  // 4 MiB
    EXPECT_GE(memory_allocated(d_), base + (4u << 20));
    bool found = false;
    for (const auto& s : device_stats())
      if (s.device == d_) found = s.device_bytes == memory_allocated(d_);
    EXPECT_TRUE(found) << "device_stats reports the allocator's bytes";
  }
  EXPECT_EQ(memory_allocated(d_), base);
  EXPECT_GE(memory_reserved(d_), base + (4u << 20)) << "a freed block waits in the cache";
  {
    Tensor again = to_device(Tensor::ones({1 << 20}), d_);
    EXPECT_EQ(memory_reserved(d_), memory_allocated(d_)) << "and is reused";
  }
  empty_cache(d_);
  EXPECT_EQ(memory_reserved(d_), base);

  double total = double(total_mem_on_dev(d_));
  set_memory_fraction(d_, (double(base) + double(8u << 20)) / total);
  std::string err = ref::error_message([&] { to_device(Tensor::ones({16 << 20}), d_); });  // 64 MiB
  set_memory_fraction(d_, 1.0);
  EXPECT_NE(err.find(d_.str() + ": out of memory"), std::string::npos) << err;
  EXPECT_NE(err.find(std::to_string(64u << 20) + " bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("held by tensors"), std::string::npos) << err;
  EXPECT_EQ(to_device(Tensor::ones({16 << 20}), d_).device(), d_) << "fits again without the cap";
  EXPECT_THROW(set_memory_fraction(d_, 1.5), Error);
}

TEST_P(GpuTensors, UnderPressureHostTensorsCopiesMakeRoom) {
  synchronize();
  empty_cache(d_);
  Tensor h1 = Tensor::ones({1 << 20}), h2 = Tensor::full({1 << 20}, 2.0);  // 4 MiB each
  auto sum_on_device = [&] {
    DefaultDevice scope(d_);
    return add(h1, h2).to_vector<float>()[12345];
  };
  EXPECT_EQ(sum_on_device(), 3.0f);  // h1 and h2 are now cached on the device too
  Tensor r;
  {
    DefaultDevice scope(d_);
    r = mul(h2, 4.0);  // a host tensor whose only current copy is on the device
  }
  synchronize();
  uint64_t held = memory_allocated(d_);
  set_memory_fraction(d_, double(held + (4u << 20)) / double(total_mem_on_dev(d_)));
  std::string err;
  Tensor big;
  try {
    big = to_device(Tensor::full({2 << 20}, 5.0), d_);  // 8 MiB: fits only without those copies
  } catch (const Error& e) {
    err = e.what();
  }
  set_memory_fraction(d_, 1.0);
  EXPECT_EQ(err, "");
  EXPECT_LE(memory_allocated(d_), held) << "the cached copies went back";
  EXPECT_EQ(big.to_vector<float>()[7], 5.0f);
  EXPECT_EQ(r.to_vector<float>()[99], 8.0f) << "an evicted only copy was first copied to the host";
  EXPECT_EQ(sum_on_device(), 3.0f) << "and come back when a call needs them";
}

TEST_P(GpuTensors, UnderPressureTheLeastRecentlyUsedCopiesGoFirst) {
  synchronize();
  empty_cache(d_);
  std::vector<Tensor> hs;
  for (int i = 0; i < 3; i++) hs.push_back(Tensor::full({1 << 20}, 1.0 + i));  // 4 MiB each
  auto read_on_device = [&](int i) {
    DefaultDevice scope(d_);
    return sum(hs[size_t(i)]).item();  // caches hs[i] on the device
  };
  for (int i : {0, 1, 2, 0}) read_on_device(i);  // hs[1] is now the least recently used
  synchronize();
  empty_cache(d_);
  uint64_t held = memory_allocated(d_);
  set_memory_fraction(d_, double(held + (1u << 20)) / double(total_mem_on_dev(d_)));
  std::string err = ref::error_message([&] {
    Tensor big = to_device(Tensor::full({1 << 20}, 9.0), d_);  // needs one copy's room
    EXPECT_EQ(memory_allocated(d_), held) << "exactly one 4 MiB copy went";
  });
  EXPECT_EQ(err, "(no error)");
  uint64_t before = bytes_to_device();
  EXPECT_EQ(read_on_device(0), 1.0 * double(1 << 20));
  EXPECT_EQ(read_on_device(2), 3.0 * double(1 << 20));
  EXPECT_EQ(bytes_to_device(), before) << "the recently used copies stayed";
  EXPECT_EQ(read_on_device(1), 2.0 * double(1 << 20));
  EXPECT_GE(bytes_to_device(), before + (4u << 20)) << "the least recently used one was evicted";
  set_memory_fraction(d_, 1.0);
}

INSTANTIATE_TEST_SUITE_P(All, GpuTensors, ::testing::Values("opencl", "cuda"),
                         [](const auto& info) { return info.param; });

TEST(DeviceTensors, BadDevicesAreClearErrors) {
  Tensor x = Tensor::ones({4});
  EXPECT_NE(ref::error_message([&] { to_device(x, "cuda:7"); }).find("cuda:7"), std::string::npos);
  EXPECT_NE(ref::error_message([&] { to_device(x, "gpu:x"); }).find("gpu:x"), std::string::npos);
  EXPECT_NE(ref::error_message([&] { memory_allocated(Device{}); }).find("holds no tensors"),
            std::string::npos);
  EXPECT_EQ(x.to(Device{}).storage(), x.storage());
}

}  // namespace

namespace {

// Runs where PoCL offers two devices (ctest sets POCL_DEVICES="pthread pthread").
TEST(TwoOpenClDevices, EachRunsKernelsAndMixedInputsNeedSoftMode) {
  const Device cl0{DeviceKind::opencl, 0}, cl1{DeviceKind::opencl, 1};
  if (!device_exists(cl1)) GTEST_SKIP() << "one OpenCL device here";
  Generator g(9);
  Tensor x = Tensor::rand({300}, DType::Float32, g), y = Tensor::rand({300}, DType::Float32, g);
  std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  Tensor x0 = to_device(x, cl0), y1 = to_device(y, cl1);
  Tensor a = mul(x0, 2.0), b = mul(y1, 3.0);
  EXPECT_EQ(a.device(), cl0);
  EXPECT_EQ(b.device(), cl1);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (size_t i = 0; i < xv.size(); i++) {
    ASSERT_FLOAT_EQ(av[i], 2 * xv[i]);
    ASSERT_FLOAT_EQ(bv[i], 3 * yv[i]);
  }
  std::string err = ref::error_message([&] { add(x0, y1); });
  EXPECT_NE(err.find("tensors on opencl:0 and opencl:1"), std::string::npos) << err;
  EXPECT_NE(err.find("soft device mode"), std::string::npos) << err;
  err = ref::error_message([&] {
    DefaultDevice scope(cl1);
    add(x0, x0);
  });
  EXPECT_NE(err.find("while the default device is opencl:1"), std::string::npos) << err;
  err = ref::error_message([&] { copy_into(to_device(Tensor::zeros({300}), cl1), x0); });
  EXPECT_NE(err.find("tensors on opencl:0 and opencl:1"), std::string::npos)
      << "writing into a tensor on another device is mixed too: " << err;

  set_soft_device_mode(true);
  Tensor s;
  {
    DefaultDevice scope(cl1);
    s = add(a, b);  // a moves from opencl:0 to opencl:1 (through the host)
  }
  Tensor h = add(a, b);  // no default device: the host (cpu)
  set_soft_device_mode(false);
  EXPECT_EQ(s.device(), cl1);
  EXPECT_EQ(h.device().kind, DeviceKind::cpu);
  std::vector<float> sv = s.to_vector<float>(), hv = h.to_vector<float>();
  for (size_t i = 0; i < xv.size(); i++) {
    ASSERT_FLOAT_EQ(sv[i], 2 * xv[i] + 3 * yv[i]) << i;
    ASSERT_FLOAT_EQ(hv[i], 2 * xv[i] + 3 * yv[i]) << i;
  }
  EXPECT_GT(memory_allocated(cl0), 0u);
  EXPECT_GT(memory_allocated(cl1), 0u);
}

}  // namespace

namespace {

// Automatic placement with a GPU among the candidates. PoCL's device runs on the host's cores, so
// automatic placement leaves it out unless OPFORGE_AUTO_CPU_OPENCL=1, which the ctest
// gpu_auto_placement sets: then these paths run without a GPU.
class GpuAutoPlacement : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* v = std::getenv("OPFORGE_AUTO_CPU_OPENCL");
    if (!v || std::string(v) != "1") GTEST_SKIP() << "OPFORGE_AUTO_CPU_OPENCL is not 1";
    if (!device_exists(gpu_)) GTEST_SKIP() << "no opencl:0 on this machine";
    reset_performance_model();
  }
  void TearDown() override { set_memory_fraction(gpu_, 1.0); }
  int64_t calls_on(const Device& d, const std::string& op) const {
    int64_t n = 0;
    for (const auto& s : dispatch_stats())
      if (s.device == d && s.op == op) n += s.calls;
    return n;
  }
  Device gpu_{DeviceKind::opencl, 0};
};

TEST_F(GpuAutoPlacement, HostCallsGoToTheGpuTooAndStayCorrect) {
  Generator g(11);
  Tensor a = Tensor::rand({96, 80}, DType::Float32, g),
         b = Tensor::rand({80, 64}, DType::Float32, g);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (int round = 0; round < 12; round++) {
    Tensor c = matmul(a, b);  // host tensors, no default device: placed automatically
    EXPECT_EQ(c.device().kind, DeviceKind::cpu) << "a host call's result lives on the host";
    std::vector<float> cv = c.to_vector<float>();
    for (int i = 0; i < 96; i += 19)
      for (int j = 0; j < 64; j += 13) {
        double want = 0;
        for (int k = 0; k < 80; k++)
          want += double(av[size_t(i * 80 + k)]) * bv[size_t(k * 64 + j)];
        EXPECT_NEAR(cv[size_t(i * 64 + j)], want, 1e-4 * (1 + std::fabs(want)));
      }
  }
  EXPECT_GT(calls_on(gpu_, "matmul"), 0) << "calibration tries the GPU";
}

// A GPU out of memory is no error for a call that automatic placement sent there: it runs on
// another device.
TEST_F(GpuAutoPlacement, AGpuOutOfMemoryFallsBackToAnotherDevice) {
  synchronize();
  empty_cache(gpu_);
  set_memory_fraction(gpu_, double(memory_allocated(gpu_) + 4096) / double(total_mem_on_dev(gpu_)));
  Tensor x = Tensor::full({1 << 18}, 1.5), y = Tensor::full({1 << 18}, 2.0);  // 1 MiB each
  std::string err = ref::error_message([&] {
    for (int i = 0; i < 12; i++) {
      Tensor z = add(x, y);
      EXPECT_EQ(z.to_vector<float>()[1000], 3.5f);
    }
  });
  EXPECT_EQ(err, "(no error)");
  EXPECT_GT(calls_on(gpu_, "add"), 0) << "the GPU was tried";
}

}  // namespace
