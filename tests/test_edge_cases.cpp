// Edge cases found in review: each once gave a wrong answer, a crash or a misleading error.
#include <gtest/gtest.h>

#include <cmath>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;

std::vector<double> iota_values(int64_t n, double start) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; i++) v.push_back(start + double(i));
  return v;
}

TEST(EdgeCases, SmallerCallInTheSameShapeBucketRespectsVariantMinimums) {
  // 32 and 20 fall in the same power-of-two bucket; the register-tiled matmul needs N >= 32.
  Generator g(3);
  Tensor a1 = Tensor::randn({32, 64}, DType::Float32, g),
         b1 = Tensor::randn({64, 32}, DType::Float32, g);
  Tensor a2 = Tensor::randn({20, 64}, DType::Float32, g),
         b2 = Tensor::randn({64, 20}, DType::Float32, g);
  for (int i = 0; i < 30; i++) matmul(a1, b1);
  auto av = a2.to_double_vector(), bv = b2.to_double_vector();
  std::vector<double> want(20 * 20);
  for (int i = 0; i < 20; i++)
    for (int j = 0; j < 20; j++)
      for (int k = 0; k < 64; k++)
        want[size_t(i * 20 + j)] += av[size_t(i * 64 + k)] * bv[size_t(k * 20 + j)];
  for (int call = 0; call < 30; call++) {
    auto cv = matmul(a2, b2).to_double_vector();
    ASSERT_EQ(cv.size(), want.size());
    for (size_t e = 0; e < want.size(); e++)
      ASSERT_NEAR(cv[e], want[e], 1e-4 * (1 + std::abs(want[e])))
          << "call " << call << ", element " << e;
  }
}

TEST(EdgeCases, CopyIntoAnOverlappingViewReadsTheSourceFirst) {
  Tensor x = Tensor::arange(0, 64, 1, DType::Float32);
  copy_into(x.slice(0, 1, 64), x.slice(0, 0, 63));
  std::vector<double> want = iota_values(64, -1);
  want[0] = 0;
  EXPECT_EQ(x.to_double_vector(), want);
}

TEST(EdgeCases, CopyIntoAnExpandedDestinationIsAnError) {
  Tensor d = Tensor::zeros({1}).expand({8});
  EXPECT_THROW(copy_into(d, Tensor::ones({8})), Error);
}

TEST(EdgeCases, DimensionFunctionsOnZeroDimTensorsAreErrors) {
  Tensor s = Tensor::scalar(1);
  EXPECT_THROW(s.slice(0, 0, 1), Error);
  EXPECT_THROW(s.select(0, 0), Error);
  EXPECT_THROW(s.size(0), Error);
  EXPECT_THROW(s.transpose(0, 0), Error);
  EXPECT_EQ(s.squeeze(0).dim(), 0);
  EXPECT_EQ(s.unsqueeze(0).shape(), Shape({1}));
  EXPECT_THROW(gather(s, 0, Tensor::zeros({2}, DType::Int64)), Error);
}

TEST(EdgeCases, SizeOneDimsWithOddStridesReachWindowKernels) {
  Generator g(5);
  Tensor x = Tensor::randn({1, 1, 1, 8}, DType::Float32, g).transpose(2, 3);  // [1, 1, 8, 1]
  Pool2dOptions o;
  o.kernel = {1, 1};
  Tensor y = max_pool2d(x, o);
  EXPECT_EQ(y.to_double_vector(), x.to_double_vector());
}

TEST(EdgeCases, ScalarsOutsideTheTensorsIntegerRangePromote) {
  Tensor x = Tensor::full({3}, 7, DType::Int32);
  EXPECT_EQ(lt(x, 3e9).to_double_vector(), std::vector<double>(3, 1.0));
  EXPECT_EQ(add(x, 3e9).dtype(), DType::Int64);
  EXPECT_DOUBLE_EQ(add(x, 3e9).to_double_vector()[0], 3e9 + 7);
}

TEST(EdgeCases, BoolReductionsCountInInt64) {
  Tensor b = gt(Tensor::arange(0, 10, 1, DType::Float32), 4.5);
  Tensor s = sum(b);
  EXPECT_EQ(s.dtype(), DType::Int64);
  EXPECT_EQ(s.item(), 5);
}

TEST(EdgeCases, SoftmaxOfAScalarKeepsItsShape) {
  Tensor y = softmax(Tensor::scalar(3.0, DType::Float32), 0);
  EXPECT_EQ(y.dim(), 0);
  EXPECT_DOUBLE_EQ(y.item(), 1.0);
}

TEST(EdgeCases, ExpandToANegativeSizeIsAnError) {
  EXPECT_THROW(Tensor::ones({1}).expand({-5}), Error);
}

TEST(EdgeCases, NonIntegerAttributeForAnIntegerSlotIsAnError) {
  Tensor x = Tensor::ones({1, 1, 4, 4});
  Conv2dOptions o;
  o.stride = {int64_t(1) << 40, 1};
  EXPECT_THROW(conv2d(x, Tensor::ones({1, 1, 1, 1}), {}, o), Error);
}

}  // namespace
