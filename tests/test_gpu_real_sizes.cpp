// The training ops on each GPU device (PoCL's opencl:0 here; cuda:0 where there is one) at the
// sizes training uses, forward and backward, against the same ops in float64 on the CPU. The
// variant tests check every variant on small shapes; sizes past a kernel's tiles, blocks and
// grid are where a GPU schedule can fail alone (the optimiser steps once asked for a device
// buffer of the tensor's size times the threads from 32 768 elements on).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace opforge;

struct Case {
  std::string name;
  Shape shape;
  std::function<Tensor(const Tensor&)> op;
  double tol;  // relative to 1 + |reference|
};

// Every element of got (float32, on the GPU) within tol * (1 + |want|) of want (float64).
void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  SCOPED_TRACE(what);
  ref::expect_close(got.cpu(), want.to_double_vector(), want.shape(), DType::Float32,
                    ref::Tol{tol, tol});
}

TEST(GpuRealSizes, TrainingOpsMatchFloat64OnTheCpu) {
  std::vector<Device> gpus;
  for (const DeviceInfo& d : devices())
    if (d.device.kind == DeviceKind::opencl || d.device.kind == DeviceKind::cuda)
      gpus.push_back(d.device);
  if (gpus.empty()) GTEST_SKIP() << "no OpenCL or CUDA device on this machine";
  Generator gen(23);
  const Tensor w = Tensor::randn({1024}, DType::Float32, gen),
               b = Tensor::randn({1024}, DType::Float32, gen),
               cw = Tensor::randn({64, 32, 5, 5}, DType::Float32, gen);
  auto like = [](const Tensor& p, const Tensor& x) { return p.to(x.dtype()).to(x.device()); };
  const std::vector<Case> cases = {
      {"softmax 64x50000", {64, 50000}, [](const Tensor& x) { return softmax(x, -1); }, 1e-5},
      {"log_softmax 128x10", {128, 10}, [](const Tensor& x) { return log_softmax(x, -1); }, 1e-5},
      {"sum of 3M", {3000000}, [](const Tensor& x) { return sum(x); }, 1e-5},
      {"sum over 4096 rows", {4096, 300}, [](const Tensor& x) { return sum(x, {0}); }, 1e-5},
      {"max over 70000", {300, 70000}, [](const Tensor& x) { return max(x, {1}); }, 0},
      {"layer_norm 512x1024",
       {512, 1024},
       [&](const Tensor& x) { return layer_norm(x, {1024}, like(w, x), like(b, x)); },
       1e-4},
      {"batch_norm 128x32x24x24",
       {128, 32, 24, 24},
       [&](const Tensor& x) {
         Tensor mean = Tensor::zeros({32}, x.dtype()).to(x.device()),
                var = Tensor::ones({32}, x.dtype()).to(x.device());
         return batch_norm(x, mean, var, like(w.slice(0, 0, 32), x), like(b.slice(0, 0, 32), x));
       },
       1e-4},
      {"conv2d 128x32x12x12, 5x5",
       {128, 32, 12, 12},
       [&](const Tensor& x) { return conv2d(x, like(cw, x)); },
       1e-4},
      {"max_pool2d 128x32x24x24",
       {128, 32, 24, 24},
       [](const Tensor& x) { return max_pool2d(x, {}); },
       0},
      {"matmul 512", {512, 512}, [](const Tensor& x) { return matmul(x, x); }, 1e-4},
      {"a transposed 2000x3000 view",
       {2000, 3000},
       [](const Tensor& x) { return mul(x.transpose(0, 1), 3.0); },
       1e-6},
  };
  for (const Device& gpu : gpus)
    for (const Case& c : cases) {
      const std::string what = c.name + " on " + gpu.str();
      const Tensor x = Tensor::randn(c.shape, DType::Float32, gen);
      Tensor x64 = x.to(DType::Float64).requires_grad_();
      Tensor want = c.op(x64);
      Tensor xg = x.to(gpu).requires_grad_();
      Tensor got;
      {
        DefaultDevice on(gpu);
        got = c.op(xg);
      }
      EXPECT_EQ(got.device(), gpu) << what;
      expect_close(got, want, c.tol, what);
      const Tensor dy = Tensor::randn(want.shape(), DType::Float32, gen);
      want.backward(dy.to(DType::Float64));
      {
        DefaultDevice on(gpu);
        got.backward(dy.to(gpu));
      }
      // A gradient sums up to (batch) terms per element: a looser bound than the forward's.
      expect_close(xg.grad(), x64.grad(), std::max(c.tol, 1e-6) * 10, what + ", gradient");
    }
}

}  // namespace
