// The elementwise gradients' conventions where finite differences say nothing (kinks, ties, a zero
// base), the reduction of broadcast gradients, and the errors of elementwise_backward.
#include <gtest/gtest.h>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using opforge::DType;
using opforge::Tensor;
using ref::make;

std::vector<double> grad_of(const std::string& op, const std::vector<Tensor>& in, size_t which = 0,
                            const opforge::AttrValues& attrs = {}) {
  Tensor g = Tensor::ones(in[0].shape(), in[0].dtype()).mul_(3.0);
  return opforge::elementwise_backward(op, in, g, attrs).at(which).to_double_vector();
}

TEST(Gradients, KinksFollowPyTorch) {
  for (DType dt : ref::kFloats) {
    SCOPED_TRACE(ref::dname(dt));
    Tensor x = make({-1, 0, 2}, {3}, dt);
    EXPECT_EQ(grad_of("relu", {x}), (std::vector<double>{0, 0, 3}));
    EXPECT_EQ(grad_of("abs", {x}), (std::vector<double>{-3, 0, 3}));
    EXPECT_EQ(grad_of("leaky_relu", {x}, 0, {0.25}), (std::vector<double>{0.75, 0.75, 3}));
    // clip: the bounds themselves pass the gradient
    Tensor c = make({-0.5, 0.75, 0.8}, {3}, dt);
    EXPECT_EQ(grad_of("clip", {c}, 0, {-0.5, 0.75}), (std::vector<double>{3, 3, 0}));
    // elu at 0: alpha * exp(0)
    EXPECT_EQ(grad_of("elu", {make({0}, {1}, dt)}, 0, {0.5}), (std::vector<double>{1.5}));
  }
}

TEST(Gradients, TiesAreSplitInHalf) {
  Tensor a = make({1, 2, 3}, {3}, DType::Float32), b = make({1, 5, 0}, {3}, DType::Float32);
  EXPECT_EQ(grad_of("maximum", {a, b}, 0), (std::vector<double>{1.5, 0, 3}));
  EXPECT_EQ(grad_of("maximum", {a, b}, 1), (std::vector<double>{1.5, 3, 0}));
  EXPECT_EQ(grad_of("minimum", {a, b}, 0), (std::vector<double>{1.5, 3, 0}));
  EXPECT_EQ(grad_of("minimum", {a, b}, 1), (std::vector<double>{1.5, 0, 3}));
}

TEST(Gradients, PowAtAZeroBaseGivesTheExponentNoGradient) {
  Tensor a = make({0, 2}, {2}, DType::Float64), b = make({2, 3}, {2}, DType::Float64);
  EXPECT_EQ(grad_of("pow", {a, b}, 0), (std::vector<double>{0, 3 * 3 * 4}));
  auto db = grad_of("pow", {a, b}, 1);
  EXPECT_EQ(db[0], 0);
  EXPECT_NEAR(db[1], 3 * 8 * std::log(2.0), 1e-12);
}

TEST(Gradients, BroadcastInputsGetSummedGradients) {
  // (2, 3) * (3,) and a (2, 1) bias: each gradient has its input's shape and dtype.
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float64);
  Tensor b = make({10, 20, 30}, {3}, DType::Float32);
  Tensor g = make({1, 1, 1, 2, 2, 2}, {2, 3}, DType::Float64);
  auto grads = opforge::elementwise_backward("mul", {a, b}, g);
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].shape(), (opforge::Shape{2, 3}));
  EXPECT_EQ(grads[0].to_double_vector(), (std::vector<double>{10, 20, 30, 20, 40, 60}));
  EXPECT_EQ(grads[1].shape(), (opforge::Shape{3}));
  EXPECT_EQ(grads[1].dtype(), DType::Float32);
  EXPECT_EQ(grads[1].to_double_vector(), (std::vector<double>{1 + 8, 2 + 10, 3 + 12}));
  Tensor bias = make({1, 2}, {2, 1}, DType::Float64);
  auto gb = opforge::elementwise_backward("add", {a, bias}, g);
  EXPECT_EQ(gb[1].shape(), (opforge::Shape{2, 1}));
  EXPECT_EQ(gb[1].to_double_vector(), (std::vector<double>{3, 6}));
}

TEST(Gradients, WhereGivesNoGradientToItsCondition) {
  Tensor c = make({1, 0, 1}, {3}, DType::Bool);
  Tensor a = make({1, 2, 3}, {3}, DType::Float32), b = make({4, 5, 6}, {3}, DType::Float32);
  auto grads = opforge::elementwise_backward("where", {c, a, b}, Tensor::ones({3}, DType::Float32));
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].to_double_vector(), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(grads[1].to_double_vector(), (std::vector<double>{0, 1, 0}));
}

TEST(Gradients, BadCallsAreClearErrors) {
  Tensor x = make({1, 2}, {2}, DType::Float32);
  Tensor g = Tensor::ones({2}, DType::Float32);
  EXPECT_OPFORGE_ERROR(opforge::elementwise_backward("floor", {x}, g),
                       "floor has no backward kernel");
  EXPECT_OPFORGE_ERROR(opforge::elementwise_backward("relu", {make({1, 2}, {2}, DType::Int32)}, g),
                       "input 0 is int32", "float32 and float64 inputs only");
  EXPECT_OPFORGE_ERROR(
      opforge::elementwise_backward("relu", {x}, Tensor::ones({3}, DType::Float32)),
      "gradient has shape [3]", "result has shape [2]");
  EXPECT_OPFORGE_ERROR(opforge::elementwise_backward("add", {x}, g), "expected 2 input(s), got 1");
  EXPECT_OPFORGE_ERROR(opforge::elementwise_backward("sum", {x}, g), "sum is a reduction op");
  EXPECT_OPFORGE_ERROR(opforge::sum_to(Tensor::ones({2, 3}, DType::Float32), {4}),
                       "does not broadcast");
}

}  // namespace
