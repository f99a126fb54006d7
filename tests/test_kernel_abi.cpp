// The kernel ABI that training needs: buffer roles in the registry and the runtime's check of every
// call against them, ops with several outputs (sincos) and with an inout buffer (axpy_), results
// written into given tensors (the _out functions) and PyTorch's in-place methods, with their rules
// for dtypes, expanded tensors and overlapping memory. Every result is compared element by element
// with a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernel_call.hpp"
#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;
using opforge::BufferRole;
using opforge::Error;

std::vector<double> values(const Tensor& t) { return t.to_double_vector(); }

TEST(KernelAbi, RegistryCarriesEachBuffersRole) {
  const auto& sc = opforge::op_info("sincos");
  EXPECT_EQ(sc.num_inputs, 1);
  EXPECT_EQ(sc.num_outputs, 2);
  EXPECT_EQ(sc.inout_mask, 0u);
  const auto& b = sc.group("float32").buffers;
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].role, BufferRole::input);
  EXPECT_EQ(b[1].role, BufferRole::output);
  EXPECT_EQ(b[2].role, BufferRole::output);
  EXPECT_EQ(b[1].dtype, DType::Float32);
  EXPECT_EQ(b[1].dims, 6);

  const auto& ax = opforge::op_info("axpy_");
  EXPECT_EQ(ax.num_inputs, 2);
  EXPECT_EQ(ax.num_outputs, 0);
  EXPECT_EQ(ax.inout_mask, 1u);
  const auto& a = ax.group("float64").buffers;
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].role, BufferRole::inout);
  EXPECT_EQ(a[1].role, BufferRole::input);
  EXPECT_EQ(a[0].dtype, DType::Float64);

  const auto& mm = opforge::op_info("matmul").group("float32").buffers;
  ASSERT_EQ(mm.size(), 3u);
  EXPECT_EQ(mm[2].role, BufferRole::output);
  EXPECT_EQ(mm[2].dims, 3);
}

// The runtime refuses buffers that do not match the contract before any kernel runs.
TEST(KernelAbi, MismatchedBuffersAreRefusedNamingOpAndBuffer) {
  using namespace opforge::detail;
  const auto& g = opforge::op_info("axpy_").group("float32");
  Tensor y = Tensor::ones({4}), x = Tensor::ones({4});
  auto six = [](const Tensor& t) {
    View v = view_of(t);
    std::vector<const opforge::Shape*> s = {&t.strides()};
    std::vector<View> vs = {v};
    collapse(t.shape(), s, vs);
    return vs[0].bind(t);
  };
  {
    KernelArgs args;  // the inout buffer passed as a plain input
    args.input(six(y));
    args.input(six(x));
    std::string m = ref::error_message([&] { args.check(g); });
    EXPECT_NE(m.find("axpy_"), std::string::npos) << m;
    EXPECT_NE(m.find("buffer 0 (in0) is passed as input, the kernel declares it inout"),
              std::string::npos)
        << m;
  }
  {
    KernelArgs args;  // a missing buffer
    args.inout(six(y));
    std::string m = ref::error_message([&] { args.check(g); });
    EXPECT_NE(m.find("passes 1 buffers, the kernel takes 2"), std::string::npos) << m;
  }
  {
    KernelArgs args;  // the wrong dtype
    Tensor xd = Tensor::ones({4}, DType::Float64);
    args.inout(six(y));
    args.input(six(xd));
    std::string m = ref::error_message([&] { args.check(g); });
    EXPECT_NE(m.find("buffer 1 (in1) is float64, expected float32"), std::string::npos) << m;
  }
  {
    KernelArgs args;  // the wrong rank
    args.inout(six(y));
    args.input(view_of(x));
    std::string m = ref::error_message([&] { args.check(g); });
    EXPECT_NE(m.find("buffer 1 (in1) has rank 1, expected 6"), std::string::npos) << m;
  }
  {
    KernelArgs args;
    args.inout(six(y));
    args.input(six(x));
    EXPECT_NO_THROW(args.check(g));
  }
}

// Every elementwise op's manual CPU kernel has a dense companion (kernel_abi.hpp), and no other
// variant or family has one.
TEST(KernelAbi, ElementwiseManualCpuKernelsHaveADenseCompanion) {
  int companions = 0;
  for (const opforge::OpInfo* op : opforge::all_ops()) {
    if (op->name.rfind("test_", 0) == 0) continue;  // the tests' own hand-made tables
    for (const auto& [key, g] : op->groups)
      for (const auto& v : g.variants) {
        bool want =
            op->family == "elementwise" && v.kind == opforge::DeviceKind::cpu && v.name == "manual";
        EXPECT_EQ(v.kernel->dense_argv != nullptr, want) << op->name << " " << key << " " << v.name;
        companions += want;
      }
  }
  EXPECT_GT(companions, 100);
}

// A call whose every buffer is contiguous runs the dense companion with one-dimensional buffers;
// a strided or broadcast buffer, or a variant without a companion, runs the strided kernel at full
// rank, also after a dense call on the same arguments (a retry on another variant).
TEST(KernelAbi, TheDenseEntryRunsOnlyContiguousCalls) {
  using namespace opforge::detail;
  const auto& g = opforge::op_info("add").group("float32");
  const opforge::KernelVariant* manual = nullptr;
  const opforge::KernelVariant* other = nullptr;
  for (const auto& v : g.variants) {
    if (v.kind != opforge::DeviceKind::cpu) continue;
    if (v.name == "manual")
      manual = v.kernel;
    else if (!other)
      other = v.kernel;
  }
  ASSERT_NE(manual, nullptr);
  auto six = [](const Tensor& t) {
    std::vector<const opforge::Shape*> s = {&t.strides()};
    std::vector<View> vs(1);
    EXPECT_TRUE(collapse(t.shape(), s, vs));
    return vs[0].bind(t);
  };
  Tensor a = Tensor::rand({3, 5}), b = Tensor::rand({3, 5}), out = Tensor::empty({3, 5});
  {
    KernelArgs args;
    args.input(six(a));
    args.input(six(b));
    args.output(six(out));
    EXPECT_EQ(args.entry_for(*manual), manual->dense_argv);
    for (int i = 0; i < 3; i++) EXPECT_EQ(args.halide_buffer(i)->dimensions, 1);
    if (other) {
      EXPECT_EQ(args.entry_for(*other), other->argv);
      for (int i = 0; i < 3; i++) EXPECT_EQ(args.halide_buffer(i)->dimensions, 6);
    }
  }
  Tensor at = Tensor::rand({5, 3}).transpose(0, 1);
  Tensor row = Tensor::rand({1, 5}).expand({3, 5});
  for (const Tensor* strided : {&at, &row}) {
    KernelArgs args;
    args.input(six(*strided));
    args.input(six(b));
    args.output(six(out));
    EXPECT_EQ(args.entry_for(*manual), manual->argv);
    for (int i = 0; i < 3; i++) EXPECT_EQ(args.halide_buffer(i)->dimensions, 6);
  }
}

// The kernels index with 32 bits (no large_buffers): a buffer of 2^31 elements or more is refused
// before any kernel runs, however it is strided.
TEST(KernelAbi, BuffersOf2To31ElementsAreRefused) {
  using namespace opforge::detail;
  Tensor one = Tensor::ones({1});
  View v;
  v.bind(one);
  v.n = 2;
  v.extent[0] = v.extent[1] = int64_t(1) << 16;  // a stride-0 view: no memory behind it
  v.stride[0] = v.stride[1] = 0;
  KernelArgs args;
  std::string m = ref::error_message([&] { args.input(v); });
  EXPECT_NE(m.find("exceeds the 2^31-element limit of generated kernels"), std::string::npos) << m;
  v.extent[1] = (int64_t(1) << 15) - 1;  // just below: accepted
  EXPECT_NO_THROW(args.input(v));
}

TEST(KernelAbi, SincosOnStridedInputs) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor base = random({9, 13}, dt, Data::Normal, "abi/sincos/" + dname(dt));
    Tensor x = base.transpose(0, 1).slice(0, 1, 13, 2);  // strided in both dims
    Expected s = broadcast_eval({x}, [](const std::vector<double>& a) { return std::sin(a[0]); });
    Expected c = broadcast_eval({x}, [](const std::vector<double>& a) { return std::cos(a[0]); });
    auto [gs, gc] = opforge::sincos(x);
    expect_close(gs, s, dt, transcendental_tol(dt));
    expect_close(gc, c, dt, transcendental_tol(dt));
    auto all = opforge::elementwise_results("sincos", {x});
    ASSERT_EQ(all.size(), 2u);
    expect_close(all[1], c, dt, transcendental_tol(dt));
  }
  std::string m = ref::error_message([] { opforge::elementwise("sincos", {Tensor::ones({3})}); });
  EXPECT_NE(m.find("sincos has 2 results; call elementwise_results()"), std::string::npos) << m;
}

TEST(KernelAbi, AxpyWritesInPlaceOnAnyView) {
  // A dense y, a strided view of y (computed on a dense copy, written back) and a view that x
  // overlaps partly (x is read completely before y is written).
  Tensor y = random({6, 8}, DType::Float32, Data::Normal, "abi/axpy/y");
  Tensor x = random({8}, DType::Float32, Data::Normal, "abi/axpy/x");
  Expected want =
      broadcast_eval({y, x}, [](const std::vector<double>& a) { return a[0] - 1.5 * a[1]; });
  auto* before = y.storage().get();
  Tensor r = opforge::axpy_(y, -1.5, x);
  EXPECT_EQ(r.storage().get(), before);
  expect_close(y, want, DType::Float32, tol_for(DType::Float32));

  Tensor big = random({8, 6}, DType::Float64, Data::Normal, "abi/axpy/big");
  std::vector<double> orig = values(big);
  Tensor yt = big.transpose(0, 1);  // innermost stride 6
  Tensor xs = random({8}, DType::Float64, Data::Normal, "abi/axpy/xs");
  std::vector<double> xv = values(xs);
  opforge::axpy_(yt, 2.0, xs);
  std::vector<double> got = values(big);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 6; j++)
      EXPECT_NEAR(got[size_t(i * 6 + j)], orig[size_t(i * 6 + j)] + 2.0 * xv[size_t(i)], 1e-12)
          << i << "," << j;

  Tensor buf = random({10}, DType::Float64, Data::Normal, "abi/axpy/overlap");
  std::vector<double> b = values(buf);
  opforge::axpy_(buf.slice(0, 0, 8), 1.0, buf.slice(0, 2, 10));  // y[i] += y[i + 2], read first
  std::vector<double> after = values(buf);
  for (int i = 0; i < 8; i++) EXPECT_NEAR(after[size_t(i)], b[size_t(i)] + b[size_t(i + 2)], 1e-12);
  for (int i = 8; i < 10; i++) EXPECT_EQ(after[size_t(i)], b[size_t(i)]);
}

TEST(KernelAbi, AxpyBadInputsAreClearErrors) {
  std::string m = ref::error_message(
      [] { opforge::axpy_(Tensor::ones({3}, DType::Int32), 1, Tensor::ones({3}, DType::Int32)); });
  EXPECT_NE(m.find("axpy_: input 0 is written in place, but it is int32 and the op computes in "
                   "float32"),
            std::string::npos)
      << m;
  m = ref::error_message([] { opforge::axpy_(Tensor::ones({3}), 1, Tensor::ones({2, 3})); });
  EXPECT_NE(m.find("input 0 of shape [3] is written in place, but the inputs broadcast to [2, 3]"),
            std::string::npos)
      << m;
  m = ref::error_message(
      [] { opforge::axpy_(Tensor::ones({1}).expand({4}), 1, Tensor::ones({4})); });
  EXPECT_NE(m.find("stride 0"), std::string::npos) << m;
  m = ref::error_message(
      [] { opforge::axpy_(Tensor::ones({3}), 1, Tensor::ones({3}, DType::Float64)); });
  EXPECT_NE(m.find("input 0 is written in place, but it is float32"), std::string::npos) << m;
}

TEST(KernelAbi, OutVariantsWriteIntoTheGivenTensor) {
  Tensor a = random({5, 7}, DType::Float32, Data::Normal, "abi/out/a");
  Tensor b = random({7}, DType::Float32, Data::Normal, "abi/out/b");
  Expected sum = broadcast_eval({a, b}, [](const std::vector<double>& v) { return v[0] + v[1]; });

  Tensor out = Tensor::empty({5, 7});
  Tensor r = opforge::add_out(out, a, b);
  EXPECT_EQ(r.storage(), out.storage());
  expect_close(out, sum, DType::Float32, tol_for(DType::Float32));

  // Into another dtype the result may be cast to, and into a strided view.
  Tensor out64 = Tensor::empty({5, 7}, DType::Float64);
  opforge::add_out(out64, a, b);
  expect_close(out64, sum, DType::Float64, tol_for(DType::Float32));
  Tensor backing = Tensor::zeros({7, 5});
  opforge::add_out(backing.transpose(0, 1), a, b);
  expect_close(backing.transpose(0, 1), sum, DType::Float32, tol_for(DType::Float32));

  // Unary and scalar forms, and clip.
  Tensor e = Tensor::empty({5, 7});
  opforge::exp_out(e, a);
  expect_close(e, broadcast_eval({a}, [](const std::vector<double>& v) { return std::exp(v[0]); }),
               DType::Float32, transcendental_tol(DType::Float32));
  opforge::mul_out(e, a, 3.0);
  expect_close(e, broadcast_eval({a}, [](const std::vector<double>& v) { return 3 * v[0]; }),
               DType::Float32, tol_for(DType::Float32));
  opforge::clip_out(e, a, -0.5, 0.25);
  expect_close(
      e,
      broadcast_eval(
          {a}, [](const std::vector<double>& v) { return std::min(std::max(v[0], -0.5), 0.25); }),
      DType::Float32, exact());
  // A comparison into an int tensor (bool casts to anything).
  Tensor cmp = Tensor::empty({5, 7}, DType::Int64);
  opforge::gt_out(cmp, a, b);
  expect_close(
      cmp, broadcast_eval({a, b}, [](const std::vector<double>& v) { return double(v[0] > v[1]); }),
      DType::Int64, exact());
}

TEST(KernelAbi, OutVariantsRefuseWhatPyTorchRefuses) {
  Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({3});
  std::string m = ref::error_message([&] { opforge::add_out(Tensor::empty({3, 2}), a, b); });
  EXPECT_NE(m.find("add: output 0 has shape [3, 2], the result has shape [2, 3]"),
            std::string::npos)
      << m;
  m = ref::error_message([&] { opforge::add_out(Tensor::empty({2, 3}, DType::Int32), a, b); });
  EXPECT_NE(m.find("the result type float32 cannot be cast to output 0's dtype int32"),
            std::string::npos)
      << m;
  m = ref::error_message([&] { opforge::add_out(Tensor::empty({1, 3}).expand({2, 3}), a, b); });
  EXPECT_NE(m.find("has stride 0 in dimension 0"), std::string::npos) << m;
  m = ref::error_message([&] { opforge::add_out(Tensor{}, a, b); });
  EXPECT_NE(m.find("output 0 is undefined"), std::string::npos) << m;
}

TEST(KernelAbi, OverlappingOutputIsReadBeforeItIsWritten) {
  // out = x + x.T on a square matrix, in place: every element must see the original x.
  Tensor x = random({6, 6}, DType::Float64, Data::Normal, "abi/overlap/x");
  std::vector<double> v = values(x);
  opforge::add_out(x, x, x.transpose(0, 1));
  std::vector<double> got = values(x);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 6; j++)
      EXPECT_NEAR(got[size_t(i * 6 + j)], v[size_t(i * 6 + j)] + v[size_t(j * 6 + i)], 1e-12);
  // Shifted views of one buffer: out[i] = in[i + 1] * 2.
  Tensor buf = random({9}, DType::Float32, Data::Normal, "abi/overlap/buf");
  std::vector<double> b = values(buf);
  opforge::mul_out(buf.slice(0, 0, 8), buf.slice(0, 1, 9), 2.0);
  std::vector<double> after = values(buf);
  for (int i = 0; i < 8; i++) EXPECT_FLOAT_EQ(float(after[size_t(i)]), float(2 * b[size_t(i + 1)]));
  EXPECT_EQ(after[8], b[8]);
}

TEST(KernelAbi, InPlaceMethods) {
  Tensor x = random({4, 5}, DType::Float32, Data::Normal, "abi/inplace/x");
  Tensor y = random({5}, DType::Float32, Data::Normal, "abi/inplace/y");
  std::vector<double> xv = values(x), yv = values(y);
  auto check = [&](const Tensor& t, const std::function<double(double, double)>& f, Tol tol) {
    std::vector<double> want(xv.size());
    for (size_t i = 0; i < xv.size(); i++) want[i] = f(xv[i], yv[i % 5]);
    expect_close(t, want, t.shape(), DType::Float32, tol);
    xv = values(t);
  };
  Tensor* same = &x.add_(y);
  EXPECT_EQ(same, &x);
  check(
      x, [](double a, double b) { return a + b; }, tol_for(DType::Float32));
  x.add_(y, 0.5);  // the axpy_ kernel
  check(
      x, [](double a, double b) { return a + 0.5 * b; }, tol_for(DType::Float32));
  x.sub_(y);
  check(
      x, [](double a, double b) { return a - b; }, tol_for(DType::Float32));
  x.sub_(y, 2);
  check(
      x, [](double a, double b) { return a - 2 * b; }, tol_for(DType::Float32));
  x.mul_(y);
  check(
      x, [](double a, double b) { return a * b; }, tol_for(DType::Float32));
  x.mul_(1.25);
  check(
      x, [](double a, double) { return a * 1.25; }, tol_for(DType::Float32));
  x.div_(2.0);
  check(
      x, [](double a, double) { return a / 2; }, tol_for(DType::Float32));
  x.add_(3.0);
  check(
      x, [](double a, double) { return a + 3; }, tol_for(DType::Float32));
  x.clamp_(2.5, 3.5);
  check(
      x, [](double a, double) { return std::min(std::max(a, 2.5), 3.5); }, exact());
  x.copy_(y);  // broadcast
  check(
      x, [](double, double b) { return b; }, exact());
  x.fill_(-2.0);
  check(
      x, [](double, double) { return -2; }, exact());
  x.zero_();
  check(
      x, [](double, double) { return 0; }, exact());

  // A row of a matrix, in place: only that row changes.
  Tensor m = random({3, 4}, DType::Float64, Data::Normal, "abi/inplace/m");
  std::vector<double> mv = values(m);
  m.select(0, 1).mul_(-1.0);
  std::vector<double> got = values(m);
  for (int i = 0; i < 12; i++) EXPECT_EQ(got[size_t(i)], (i / 4 == 1 ? -1 : 1) * mv[size_t(i)]);

  // Integers: add_ with alpha is other * alpha, as in PyTorch; a float result is refused.
  Tensor n = Tensor::from_vector<int32_t>({1, 2, 3});
  n.add_(Tensor::from_vector<int32_t>({10, 20, 30}), 2);
  EXPECT_EQ(n.to_vector<int32_t>(), (std::vector<int32_t>{21, 42, 63}));
  std::string msg = ref::error_message([&] { n.add_(1.5); });
  EXPECT_NE(msg.find("cannot be cast to output 0's dtype int32"), std::string::npos) << msg;
  msg = ref::error_message([&] { Tensor::ones({1}).expand({3}).add_(1.0); });
  EXPECT_NE(msg.find("stride 0"), std::string::npos) << msg;
  msg = ref::error_message([&] { Tensor::ones({3}).mul_(Tensor::ones({2, 3})); });
  EXPECT_NE(msg.find("output 0 has shape [3], the result has shape [2, 3]"), std::string::npos)
      << msg;
}

// On a GPU device the in-place kernels write the device copy, which the host then reads back.
TEST(KernelAbi, InPlaceOnGpuTensors) {
  for (opforge::DeviceKind kind : {opforge::DeviceKind::opencl, opforge::DeviceKind::cuda}) {
    opforge::Device d{kind, 0};
    if (!opforge::device_exists(d)) continue;
    SCOPED_TRACE(d.str());
    Tensor yh = random({3, 50}, DType::Float32, Data::Normal, "abi/gpu/y");
    Tensor xh = random({50}, DType::Float32, Data::Normal, "abi/gpu/x");
    Expected want =
        broadcast_eval({yh, xh}, [](const std::vector<double>& a) { return a[0] + 4 * a[1]; });
    Tensor y = yh.to(d), x = xh.to(d);
    opforge::axpy_(y, 4.0, x);
    EXPECT_EQ(y.device(), d);
    expect_close(y, want, DType::Float32, tol_for(DType::Float32));
    auto [s, c] = opforge::sincos(x);
    EXPECT_EQ(c.device(), d);
    expect_close(c,
                 broadcast_eval({xh}, [](const std::vector<double>& a) { return std::cos(a[0]); }),
                 DType::Float32, transcendental_tol(DType::Float32));
    y.mul_(x);
    std::vector<double> w = want.values, xv = values(xh);
    for (size_t i = 0; i < w.size(); i++) w[i] *= xv[i % 50];
    expect_close(y, w, y.shape(), DType::Float32, tol_for(DType::Float32));
  }
}

}  // namespace
