// The NumPy-style frontend keeps NumPy's defaults and semantics where they differ from the core
// API.
#include <gtest/gtest.h>

#include <cmath>

#include "opforge/numpy.hpp"

namespace {
namespace np = opforge::numpy;
using opforge::DType;
using opforge::Shape;

TEST(NumpyFrontend, CreationDefaultsToFloat64) {
  EXPECT_EQ(np::zeros({2, 3}).dtype(), DType::Float64);
  EXPECT_EQ(np::arange(0, 5).to_double_vector(), (std::vector<double>{0, 1, 2, 3, 4}));
}

TEST(NumpyFrontend, IntegerTrueDivisionGivesFloat64) {
  auto a = np::array<int32_t>({7, -7, 9}, {3});
  auto b = np::array<int32_t>({2, 2, -4}, {3});
  auto q = np::divide(a, b);
  EXPECT_EQ(q.dtype(), DType::Float64);
  EXPECT_EQ(q.to_double_vector(), (std::vector<double>{3.5, -3.5, -2.25}));
  EXPECT_EQ(np::floor_divide(a, b).to_double_vector(), (std::vector<double>{3, -4, -3}));
  EXPECT_EQ(np::remainder(a, b).to_double_vector(), (std::vector<double>{1, 1, -3}));
}

TEST(NumpyFrontend, ReductionsWithAxisNone) {
  auto x = np::array<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_DOUBLE_EQ(np::sum(x).item(), 21);
  EXPECT_EQ(np::sum(x, std::vector<int>{0}).to_double_vector(), (std::vector<double>{5, 7, 9}));
  EXPECT_NEAR(np::std(x).item(), std::sqrt(35.0 / 12.0), 1e-12);
  EXPECT_EQ(np::argmax(x).item(), 5);
}

TEST(NumpyFrontend, DotStackTakeTranspose) {
  auto v = np::array<double>({1, 2, 3}, {3});
  EXPECT_DOUBLE_EQ(np::dot(v, v).item(), 14);
  auto s = np::stack({v, v}, 0);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  auto w = np::array<double>({4, 5, 6}, {3});
  auto s1 = np::stack({v, w}, 1);
  EXPECT_EQ(s1.shape(), (Shape{3, 2}));
  EXPECT_EQ(s1.to_double_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  auto m = np::array<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(np::transpose(m).shape(), (Shape{3, 2}));
  EXPECT_EQ(np::transpose(m).contiguous().to_double_vector(),
            (std::vector<double>{1, 4, 2, 5, 3, 6}));
  auto idx = np::array<int64_t>({5, 0, -1}, {3});
  EXPECT_EQ(np::take(m, idx).to_double_vector(), (std::vector<double>{6, 1, 6}));
  EXPECT_THROW(np::dot(np::zeros({2, 2, 2}), v), opforge::Error);
}

}  // namespace
