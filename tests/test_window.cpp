// conv2d (stride, padding, dilation, groups, bias) and max/avg pooling on NCHW images against the
// float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

struct ConvCase {
  std::string label;
  Shape x;  // N, C, H, W
  Shape w;  // Cout, C / groups, KH, KW
  ConvParams p;
  bool bias;
};

ConvParams cp(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1, int64_t dw = 1,
              int64_t g = 1) {
  ConvParams p;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dil_h = dh;
  p.dil_w = dw;
  p.groups = g;
  return p;
}

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3, no padding", {2, 3, 7, 9}, {4, 3, 3, 3}, cp(1, 1, 0, 0), false},
      {"3x3 with bias", {2, 3, 7, 9}, {4, 3, 3, 3}, cp(1, 1, 0, 0), true},
      {"stride 2, padding 1", {1, 3, 11, 13}, {5, 3, 3, 3}, cp(2, 2, 1, 1), true},
      {"stride (2, 3), padding (1, 2), 3x2 kernel",
       {2, 2, 10, 11},
       {3, 2, 3, 2},
       cp(2, 3, 1, 2),
       true},
      {"dilation 2, padding 2", {1, 2, 13, 11}, {3, 2, 3, 3}, cp(1, 1, 2, 2, 2, 2), false},
      {"dilation (2, 1), stride (1, 2)", {1, 3, 12, 12}, {2, 3, 3, 3}, cp(1, 2, 1, 0, 2, 1), true},
      {"groups 2, padding 1", {2, 4, 8, 8}, {6, 2, 3, 3}, cp(1, 1, 1, 1, 1, 1, 2), true},
      {"groups 3, stride 2", {1, 6, 9, 9}, {3, 2, 3, 3}, cp(2, 2, 0, 0, 1, 1, 3), false},
      {"depthwise", {2, 5, 7, 7}, {5, 1, 3, 3}, cp(1, 1, 1, 1, 1, 1, 5), true},
      {"depthwise, multiplier 2, stride 2",
       {1, 5, 9, 8},
       {10, 1, 3, 3},
       cp(2, 2, 1, 1, 1, 1, 5),
       false},
      {"1x1 kernel", {1, 8, 5, 5}, {4, 8, 1, 1}, cp(1, 1, 0, 0), true},
      {"odd sizes, 5x3 kernel, padding (2, 1)", {3, 3, 13, 11}, {7, 3, 5, 3}, cp(1, 1, 2, 1), true},
      {"kernel as large as the image", {1, 2, 5, 5}, {3, 2, 5, 5}, cp(1, 1, 0, 0), true},
      {"single pixel", {1, 1, 1, 1}, {1, 1, 1, 1}, cp(1, 1, 0, 0), true},
      {"padding larger than needed", {1, 2, 4, 4}, {2, 2, 3, 3}, cp(1, 1, 2, 2), true},
  };
}

class ConvTest : public ::testing::TestWithParam<DType> {};

void check_conv(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, DType dt,
                const std::string& label) {
  SCOPED_TRACE("conv2d " + label + ": x " + sstr(x.shape()) + ", w " + sstr(w.shape()) +
               (b.defined() ? ", bias" : "") + ", stride (" + std::to_string(p.stride_h) + ", " +
               std::to_string(p.stride_w) + "), padding (" + std::to_string(p.pad_h) + ", " +
               std::to_string(p.pad_w) + "), dilation (" + std::to_string(p.dil_h) + ", " +
               std::to_string(p.dil_w) + "), groups " + std::to_string(p.groups) + " at " +
               dname(dt));
  Expected want =
      conv2d(dense(x), dense(w), b.defined() ? b.to_double_vector() : std::vector<double>{}, p);
  Tensor got;
  try {
    got = opforge::conv2d(x, w, b, options_of(p));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  expect_close(got, want, dt, accum_tol(dt, w.shape()[1] * w.shape()[2] * w.shape()[3]));
}

TEST_P(ConvTest, MatchesReference) {
  DType dt = GetParam();
  for (const ConvCase& c : conv_cases()) {
    Tensor x = random(c.x, dt, Data::Normal, "conv x " + c.label);
    Tensor w = random(c.w, dt, Data::Normal, "conv w " + c.label);
    Tensor b = c.bias ? random({c.w[0]}, dt, Data::Normal, "conv b " + c.label) : Tensor();
    check_conv(x, w, b, c.p, dt, c.label);
  }
}

TEST_P(ConvTest, NonContiguousInputs) {
  DType dt = GetParam();
  // an NHWC buffer viewed as NCHW, and a weight sliced with step 2 along the output channels
  Tensor x = random({2, 8, 9, 3}, dt, Data::Normal, "conv nhwc").permute({0, 3, 1, 2});
  Tensor w = random({8, 3, 3, 3}, dt, Data::Normal, "conv w2").slice(0, 0, 8, 2);
  Tensor b = random({8}, dt, Data::Normal, "conv b2").slice(0, 1, 8, 2);
  check_conv(x, w, b, cp(1, 2, 1, 1), dt, "NHWC view, sliced weight and bias");
}

TEST_P(ConvTest, DefaultOptionsAreStride1NoPadding) {
  DType dt = GetParam();
  Tensor x = random({1, 2, 6, 5}, dt, Data::Normal, "conv def x");
  Tensor w = random({3, 2, 3, 3}, dt, Data::Normal, "conv def w");
  Tensor got = opforge::conv2d(x, w);
  expect_close(got, conv2d(dense(x), dense(w), {}, ConvParams{}), dt, accum_tol(dt, 18));
  EXPECT_EQ(got.shape(), (Shape{1, 3, 4, 3}));
}

// conv2d's two gradient ops on every geometry above, against the scatter-form references.
TEST_P(ConvTest, GradientsMatchReference) {
  DType dt = GetParam();
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE("conv2d gradients " + c.label + " at " + dname(dt));
    Expected y = conv2d(Dense{std::vector<double>(size_t(numel(c.x))), c.x},
                        Dense{std::vector<double>(size_t(numel(c.w))), c.w}, {}, c.p);
    Tensor x = random(c.x, dt, Data::Normal, "convg x " + c.label);
    Tensor w = random(c.w, dt, Data::Normal, "convg w " + c.label);
    Tensor g = random(y.shape, dt, Data::Normal, "convg g " + c.label);
    opforge::Conv2dOptions o = options_of(c.p);
    try {
      Tensor gx = opforge::conv2d_backward_input(g, w, c.x, o);
      expect_close(gx, conv2d_backward_input(dense(g), dense(w), c.x, c.p), dt,
                   accum_tol(dt, numel(c.w)));
      Tensor gw = opforge::conv2d_backward_weight(x, g, c.w, o);
      expect_close(gw, conv2d_backward_weight(dense(x), dense(g), c.w, c.p), dt,
                   accum_tol(dt, numel(y.shape)));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

// conv_transpose2d is conv2d's input gradient with PyTorch's weight layout and output size.
TEST_P(ConvTest, ConvTransposeMatchesReference) {
  DType dt = GetParam();
  Tensor x = random({2, 4, 5, 6}, dt, Data::Normal, "convt x");
  Tensor w = random({4, 3, 3, 2}, dt, Data::Normal, "convt w");  // (C_in, C_out / groups, kH, kW)
  Tensor b = random({6}, dt, Data::Normal, "convt b");
  opforge::ConvTranspose2dOptions o;
  o.stride = {2, 3};
  o.padding = {1, 0};
  o.output_padding = {1, 2};
  o.groups = 2;
  Tensor got = opforge::conv_transpose2d(x, w, b, o);
  // (5 - 1) * 2 - 2 + 2 + 1 + 1 = 10 rows, (6 - 1) * 3 + 1 + 2 + 1 = 19 columns
  ASSERT_EQ(got.shape(), (Shape{2, 6, 10, 19}));
  Expected want =
      conv2d_backward_input(dense(x), dense(w), {2, 6, 10, 19}, cp(2, 3, 1, 0, 1, 1, 2));
  for (int64_t i = 0; i < int64_t(want.values.size()); i++)
    want.values[size_t(i)] += b.to_double_vector()[size_t(i / (10 * 19) % 6)];
  expect_close(got, want, dt, accum_tol(dt, 18));
  o.output_padding = {2, 0};
  EXPECT_THROW(opforge::conv_transpose2d(x, w, b, o), opforge::Error);
}

INSTANTIATE_TEST_SUITE_P(Floats, ConvTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- pooling ----

struct PoolCase {
  std::string label;
  Shape x;
  PoolParams p;
};

PoolParams pp(int64_t kh, int64_t kw, int64_t sh = 0, int64_t sw = 0, int64_t ph = 0,
              int64_t pw = 0) {
  PoolParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  return p;
}

std::vector<PoolCase> pool_cases() {
  return {
      {"2x2, default stride", {2, 3, 8, 8}, pp(2, 2)},
      {"2x2, default stride, odd image", {1, 2, 9, 7}, pp(2, 2)},
      {"3x3, stride 2, padding 1", {1, 2, 9, 7}, pp(3, 3, 2, 2, 1, 1)},
      {"3x2, stride (1, 2), padding (1, 0)", {2, 3, 10, 9}, pp(3, 2, 1, 2, 1, 0)},
      {"2x2, stride 1", {1, 3, 6, 5}, pp(2, 2, 1, 1)},
      {"5x3, stride 2, padding (2, 1), odd sizes", {1, 4, 13, 11}, pp(5, 3, 2, 2, 2, 1)},
      {"1x1", {2, 2, 3, 4}, pp(1, 1)},
      {"whole image", {1, 3, 5, 6}, pp(5, 6)},
  };
}

class PoolTest : public ::testing::TestWithParam<DType> {};

void check_pool(const Tensor& x, PoolParams p, bool is_max, DType dt, const std::string& label) {
  std::string name = is_max ? "max_pool2d" : "avg_pool2d";
  SCOPED_TRACE(name + " " + label + ": x " + sstr(x.shape()) + ", kernel (" +
               std::to_string(p.kernel_h) + ", " + std::to_string(p.kernel_w) + "), stride (" +
               std::to_string(p.stride_h) + ", " + std::to_string(p.stride_w) + "), padding (" +
               std::to_string(p.pad_h) + ", " + std::to_string(p.pad_w) + ")" +
               (is_max                ? ""
                : p.count_include_pad ? ", count_include_pad"
                                      : ", exclude padding") +
               " at " + dname(dt));
  Expected want = pool2d(dense(x), p, is_max);
  opforge::Pool2dOptions o = options_of(p);
  Tensor got;
  try {
    got = is_max ? opforge::max_pool2d(x, o) : opforge::avg_pool2d(x, o);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  expect_close(got, want, dt, accum_tol(dt, p.kernel_h * p.kernel_w));
}

TEST_P(PoolTest, MatchesReference) {
  DType dt = GetParam();
  for (const PoolCase& c : pool_cases()) {
    Tensor x = random(c.x, dt, Data::Normal, "pool " + c.label);
    check_pool(x, c.p, true, dt, c.label);
    for (bool include : {true, false}) {
      PoolParams p = c.p;
      p.count_include_pad = include;
      check_pool(x, p, false, dt, c.label);
    }
  }
}

// The pools' gradient ops on every geometry above, against the reference.
TEST_P(PoolTest, GradientsMatchReference) {
  DType dt = GetParam();
  for (const PoolCase& c : pool_cases())
    for (int k = 0; k < 3; k++) {
      bool is_max = k == 0;
      PoolParams p = c.p;
      p.count_include_pad = k == 1;
      SCOPED_TRACE(std::string(is_max ? "max" : "avg") + "_pool2d_backward " + c.label +
                   (is_max                ? ""
                    : p.count_include_pad ? ", count_include_pad"
                                          : "") +
                   " at " + dname(dt));
      Tensor x = random(c.x, dt, Data::Normal, "poolg x " + c.label);
      Shape ys = pool2d(dense(x), p, is_max).shape;
      Tensor g = random(ys, dt, Data::Normal, "poolg g " + c.label);
      opforge::Pool2dOptions o = options_of(p);
      try {
        Tensor got =
            is_max ? opforge::max_pool2d_backward(x, g, o) : opforge::avg_pool2d_backward(x, g, o);
        expect_close(got, pool2d_backward(dense(x), dense(g), p, is_max), dt,
                     accum_tol(dt, p.kernel_h * p.kernel_w));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw: " << e.what();
      }
    }
}

TEST_P(PoolTest, MaxPoolIgnoresPaddingOfNegativeImages) {
  DType dt = GetParam();
  // every value is negative, so a padded zero must never win
  Tensor x = opforge::sub(random({1, 2, 7, 6}, dt, Data::Unit, "pool negative"), 5.0);
  check_pool(x, pp(3, 3, 2, 2, 1, 1), true, dt, "negative image");
  check_pool(x, pp(3, 3, 1, 1, 1, 1), true, dt, "negative image, stride 1");
}

// PyTorch's max_pool2d at special values: a window with a NaN gives NaN and its gradient goes to
// the last NaN; a window of -inf gives -inf and its gradient goes to its first tap; +inf wins.
TEST_P(PoolTest, MaxPoolNaNAndInfinities) {
  DType dt = GetParam();
  const double nan = std::nan(""), inf = INFINITY;
  // Four 2x2 windows of a 4x4 image: a NaN after a smaller value and before a larger one; all
  // -inf; two NaNs; +inf twice.
  Tensor x = Tensor::from_vector<double>({1, nan, -inf, -inf,  //
                                          9, 2, -inf, -inf,    //
                                          nan, 1, 3, inf,      //
                                          2, nan, inf, 5},
                                         {1, 1, 4, 4})
                 .to(dt);
  opforge::Pool2dOptions o;  // 2x2, stride 2
  std::vector<double> y = opforge::max_pool2d(x, o).to_double_vector();
  ASSERT_EQ(y.size(), 4u);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], -inf);
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], inf);
  Tensor g = Tensor::from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(dt);
  std::vector<double> gx = opforge::max_pool2d_backward(x, g, o).to_double_vector();
  EXPECT_EQ(gx, (std::vector<double>{0, 1, 2, 0,  //
                                     0, 0, 0, 0,  //
                                     0, 0, 0, 4,  //
                                     0, 3, 0, 0}));
  expect_close(opforge::max_pool2d_backward(x, g, o),
               pool2d_backward(dense(x), dense(g), PoolParams{}, true), dt, exact());
  // The indices PyTorch's return_indices gives: where each window's result lies in the plane.
  auto [values, at] = opforge::max_pool2d_with_indices(x, o);
  EXPECT_EQ(at.dtype(), DType::Int64);
  EXPECT_EQ(at.to_double_vector(), (std::vector<double>{1, 2, 13, 11}));
  std::vector<double> v = values.to_double_vector();
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[2]) && v[1] == -inf && v[3] == inf);
}

// Under autograd max_pool2d saves its windows' indices and its gradient reads them: the gradient
// equals the one found from the input, on overlapping padded windows with ties (every window of a
// constant image ties: the first tap inside wins), and the returned indices are PyTorch's.
TEST_P(PoolTest, MaxPoolGradientFromSavedIndices) {
  DType dt = GetParam();
  opforge::Pool2dOptions o;
  o.kernel = {3, 3};
  o.stride = {2, 2};
  o.padding = {1, 1};
  PoolParams p = pp(3, 3, 2, 2, 1, 1);
  for (bool ties : {false, true}) {
    SCOPED_TRACE(ties ? "ties" : "random");
    Tensor data = ties ? Tensor::full({2, 3, 7, 9}, 0.5, dt)
                       : random({2, 3, 7, 9}, dt, Data::Normal, "pool saved indices");
    Tensor x = data.clone().requires_grad_();
    auto [y, at] = opforge::max_pool2d_with_indices(x, o);
    expect_close(at, max_pool2d_indices(dense(data), p), DType::Int64, exact());
    Tensor g = random(y.shape(), dt, Data::Normal, "pool saved indices g");
    y.backward(g);
    expect_close(x.grad(), pool2d_backward(dense(data), dense(g), p, true), dt, tol_for(dt));
    // max_pool2d itself takes the same path when it records.
    Tensor x2 = data.clone().requires_grad_();
    opforge::max_pool2d(x2, o).backward(g);
    expect_close(x2.grad(), pool2d_backward(dense(data), dense(g), p, true), dt, tol_for(dt));
  }
}

// max_unpool2d puts each window's maximum back where its index says, zeros elsewhere (PyTorch's);
// its gradient is the output's gradient at those places. Bad indices and sizes are refused.
TEST_P(PoolTest, MaxUnpoolUndoesThePoolsSelection) {
  DType dt = GetParam();
  Tensor x = random({2, 3, 6, 7}, dt, Data::Normal, "unpool");
  opforge::Pool2dOptions o;  // 2x2, stride 2: 3 x 3 windows (x's last column in none)
  auto [y, at] = opforge::max_pool2d_with_indices(x, o);
  Tensor yg = y.detach().requires_grad_();
  // Planes of x's 6 x 7, where the indices count (the options alone give 6 x 6).
  Tensor u = opforge::max_unpool2d(yg, at, o, std::array<int64_t, 2>{6, 7});
  ASSERT_EQ(u.shape(), x.shape());
  std::vector<double> want(size_t(x.numel()), 0.0), iv = at.to_double_vector(),
                                                    yv = y.to_double_vector();
  for (size_t p = 0; p < 6; p++)
    for (size_t k = 0; k < 9; k++) want[p * 42 + size_t(iv[p * 9 + k])] = yv[p * 9 + k];
  EXPECT_EQ(u.to_double_vector(), want);
  Tensor g = random(u.shape(), dt, Data::Normal, "unpool g");
  u.backward(g);
  std::vector<double> gv = g.to_double_vector(), want_g(yv.size());
  for (size_t p = 0; p < 6; p++)
    for (size_t k = 0; k < 9; k++) want_g[p * 9 + k] = gv[p * 42 + size_t(iv[p * 9 + k])];
  EXPECT_EQ(yg.grad().to_double_vector(), want_g);
  // The default size, and sizes and indices it refuses.
  auto [y6, at6] = opforge::max_pool2d_with_indices(x.slice(3, 0, 6), o);
  EXPECT_EQ(opforge::max_unpool2d(y6, at6, o).shape(), (Shape{2, 3, 6, 6}));
  EXPECT_OPFORGE_ERROR(opforge::max_unpool2d(y, at, o, std::array<int64_t, 2>{9, 6}),
                       "max_unpool2d", "height");
  EXPECT_OPFORGE_ERROR(opforge::max_unpool2d(y6, opforge::add(at6, 100.0).to(DType::Int64), o),
                       "max_unpool2d", "invalid index");
  EXPECT_OPFORGE_ERROR(opforge::max_unpool2d(y, at.to(dt), o), "max_unpool2d", "int64");
}

TEST_P(PoolTest, NonContiguousInput) {
  DType dt = GetParam();
  Tensor x =
      random({2, 9, 8, 3}, dt, Data::Normal, "pool nhwc").permute({0, 3, 1, 2});  // [2, 3, 9, 8]
  check_pool(x, pp(3, 3, 2, 2, 1, 1), true, dt, "NHWC view");
  PoolParams p = pp(3, 3, 2, 2, 1, 1);
  p.count_include_pad = false;
  check_pool(x, p, false, dt, "NHWC view");
}

INSTANTIATE_TEST_SUITE_P(Floats, PoolTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

}  // namespace
