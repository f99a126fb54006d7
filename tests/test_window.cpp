// conv2d (stride, padding, dilation, groups, bias) and max/avg pooling on NCHW images against the
// float64 reference.
#include <gtest/gtest.h>

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
  opforge::Conv2dOptions o;
  o.stride = {p.stride_h, p.stride_w};
  o.padding = {p.pad_h, p.pad_w};
  o.dilation = {p.dil_h, p.dil_w};
  o.groups = p.groups;
  Tensor got;
  try {
    got = opforge::conv2d(x, w, b, o);
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
  opforge::Pool2dOptions o;
  o.kernel = {p.kernel_h, p.kernel_w};
  o.stride = {p.stride_h, p.stride_w};
  o.padding = {p.pad_h, p.pad_w};
  o.count_include_pad = p.count_include_pad;
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

TEST_P(PoolTest, MaxPoolIgnoresPaddingOfNegativeImages) {
  DType dt = GetParam();
  // every value is negative, so a padded zero must never win
  Tensor x = opforge::sub(random({1, 2, 7, 6}, dt, Data::Unit, "pool negative"), 5.0);
  check_pool(x, pp(3, 3, 2, 2, 1, 1), true, dt, "negative image");
  check_pool(x, pp(3, 3, 1, 1, 1, 1), true, dt, "negative image, stride 1");
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
