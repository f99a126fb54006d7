// Bad inputs raise opforge::Error, and the message names the op and says what was expected.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;
using opforge::Error;

Tensor f32(const Shape& s) { return random(s, DType::Float32, Data::Normal, "errors" + sstr(s)); }

TEST(Errors, NonBroadcastableShapes) {
  EXPECT_THROW(opforge::add(f32({2, 3}), f32({4})), Error);
  EXPECT_OPFORGE_ERROR(opforge::add(f32({2, 3}), f32({4})), "add", "[2, 3]", "[4]");
  EXPECT_OPFORGE_ERROR(opforge::mul(f32({4, 1, 5}), f32({3, 2})), "mul", "[4, 1, 5]", "[3, 2]");
  EXPECT_OPFORGE_ERROR(opforge::where(make({1, 0}, {2}, DType::Bool), f32({3}), f32({3})), "where",
                       "[2]", "[3]");
  EXPECT_OPFORGE_ERROR(opforge::copy_into(Tensor::zeros({3, 4}), f32({3})), "copy_into", "[3, 4]",
                       "[3]");
}

TEST(Errors, MatmulInnerDimensionMismatch) {
  EXPECT_THROW(opforge::matmul(f32({2, 3}), f32({4, 5})), Error);
  EXPECT_OPFORGE_ERROR(opforge::matmul(f32({2, 3}), f32({4, 5})), "matmul", "[2, 3]", "[4, 5]");
  EXPECT_OPFORGE_ERROR(opforge::matmul(f32({2, 2, 3}), f32({3, 3, 4})), "matmul", "[2, 2, 3]",
                       "[3, 3, 4]");
  EXPECT_OPFORGE_ERROR(opforge::matmul(f32({3}), f32({4})), "matmul", "[3]", "[4]");
  EXPECT_OPFORGE_ERROR(opforge::gemm(f32({2, 3}), f32({4, 5})), "gemm", "[2, 3]", "[4, 5]");
  EXPECT_OPFORGE_ERROR(opforge::gemm(f32({2, 3}), f32({3, 5}), f32({3, 5})), "gemm", "[3, 5]");
  EXPECT_OPFORGE_ERROR(opforge::gemm(f32({2, 3, 1}), f32({3, 5})), "gemm", "[2, 3, 1]");
}

TEST(Errors, UnsupportedDtype) {
  EXPECT_THROW(opforge::logical_and(f32({3}), f32({3})), Error);
  EXPECT_OPFORGE_ERROR(opforge::logical_and(f32({3}), f32({3})), "logical_and", "float32", "bool");
  Tensor b = make({1, 0, 1}, {3}, DType::Bool);
  EXPECT_OPFORGE_ERROR(opforge::neg(b), "neg", "bool", "float32");
  EXPECT_OPFORGE_ERROR(opforge::logical_not(make({1, 2}, {2}, DType::Int32)), "logical_not",
                       "int32", "bool");
}

TEST(Errors, AxisOutOfRange) {
  Tensor x = f32({2, 3});
  EXPECT_THROW(opforge::sum(x, {2}), Error);
  EXPECT_OPFORGE_ERROR(opforge::sum(x, {2}), "sum", "2");
  EXPECT_OPFORGE_ERROR(opforge::sum(x, {-3}), "sum", "-3");
  EXPECT_OPFORGE_ERROR(opforge::mean(x, {5}, true), "mean", "5");
  EXPECT_OPFORGE_ERROR(opforge::softmax(x, 2), "softmax", "2");
  EXPECT_OPFORGE_ERROR(opforge::log_softmax(x, -3), "log_softmax", "-3");
  EXPECT_OPFORGE_ERROR(opforge::argmax(x, 2), "argmax", "2");
  EXPECT_OPFORGE_ERROR(opforge::argmin(x, -3), "argmin", "-3");
  EXPECT_OPFORGE_ERROR(opforge::concat({x, x}, 2), "concat", "2");
  EXPECT_OPFORGE_ERROR(opforge::index_select(x, 3, make({0}, {1}, DType::Int64)), "index_select",
                       "3");
  EXPECT_OPFORGE_ERROR(x.transpose(0, 2), "transpose", "2");
}

TEST(Errors, DuplicateAxes) {
  Tensor x = f32({2, 3, 4});
  EXPECT_THROW(opforge::sum(x, {1, 1}), Error);
  EXPECT_OPFORGE_ERROR(opforge::sum(x, {1, 1}), "sum", "1");
  EXPECT_OPFORGE_ERROR(opforge::max(x, {0, -3}), "max");  // the same axis spelled two ways
  EXPECT_OPFORGE_ERROR(x.permute({0, 0, 1}), "permute");
}

TEST(Errors, ReshapeToAWrongElementCount) {
  Tensor x = f32({2, 3});
  EXPECT_THROW(x.reshape({4}), Error);
  EXPECT_OPFORGE_ERROR(x.reshape({4}), "reshape", "[4]", "6");
  EXPECT_OPFORGE_ERROR(x.reshape({-1, 4}), "reshape", "6");
  EXPECT_OPFORGE_ERROR(x.reshape({-1, -1}), "reshape");
  EXPECT_OPFORGE_ERROR(x.view({7}), "view", "[7]");
}

TEST(Errors, SliceClampsButSelectChecks) {
  Tensor x = f32({5, 4});
  // slicing out of range is not an error: the range is clamped as in Python
  EXPECT_NO_THROW({
    EXPECT_EQ(x.slice(0, 3, 100).shape(), (Shape{2, 4}));
    EXPECT_EQ(x.slice(0, -100, 2).shape(), (Shape{2, 4}));
    EXPECT_EQ(x.slice(1, 10, 20).shape(), (Shape{5, 0}));
  });
  EXPECT_THROW(x.select(0, 5), Error);
  EXPECT_OPFORGE_ERROR(x.select(0, 5), "select", "5");
  EXPECT_OPFORGE_ERROR(x.select(1, -5), "select", "-5");
  EXPECT_OPFORGE_ERROR(x.slice(0, 0, 5, 0), "slice", "step");
}

TEST(Errors, IndexOutOfRange) {
  Tensor x = f32({5, 4});
  EXPECT_THROW(opforge::index_select(x, 0, make({0, 7}, {2}, DType::Int64)), Error);
  EXPECT_OPFORGE_ERROR(opforge::index_select(x, 0, make({0, 7}, {2}, DType::Int64)), "index_select",
                       "7", "5");
  EXPECT_OPFORGE_ERROR(opforge::index_select(x, 1, make({-9}, {1}, DType::Int32)), "index_select",
                       "-9", "4");
  EXPECT_OPFORGE_ERROR(opforge::gather(x, 1, make({4}, {1}, DType::Int64)), "4");
  EXPECT_OPFORGE_ERROR(opforge::index_select(x, 0, f32({2})), "index_select", "float32");
}

TEST(Errors, Conv2dShapes) {
  Tensor x = f32({1, 3, 5, 5});
  // weight expects 2 input channels per group, the image has 3
  EXPECT_THROW(opforge::conv2d(x, f32({4, 2, 3, 3})), Error);
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x, f32({4, 2, 3, 3})), "conv2d", "3", "2");
  // groups must divide the input channels...
  opforge::Conv2dOptions g2;
  g2.groups = 2;
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x, f32({4, 1, 3, 3}), {}, g2), "conv2d", "groups");
  // ...and the output channels
  Tensor x4 = f32({1, 4, 5, 5});
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x4, f32({5, 2, 3, 3}), {}, g2), "conv2d", "groups");
  opforge::Conv2dOptions g0;
  g0.groups = 0;
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x4, f32({4, 4, 3, 3}), {}, g0), "conv2d", "groups");
  // bias of the wrong length, a 3-D image, a kernel larger than the padded image, a zero stride
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x, f32({4, 3, 3, 3}), f32({3})), "conv2d", "bias");
  EXPECT_OPFORGE_ERROR(opforge::conv2d(f32({3, 5, 5}), f32({4, 3, 3, 3})), "conv2d", "[3, 5, 5]");
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x, f32({4, 3, 7, 7})), "conv2d");
  opforge::Conv2dOptions s0;
  s0.stride = {0, 1};
  EXPECT_OPFORGE_ERROR(opforge::conv2d(x, f32({4, 3, 3, 3}), {}, s0), "conv2d", "stride");
  opforge::Pool2dOptions big;
  big.kernel = {7, 7};
  EXPECT_OPFORGE_ERROR(opforge::max_pool2d(x, big), "max_pool2d");
  EXPECT_OPFORGE_ERROR(opforge::avg_pool2d(f32({5, 5}), opforge::Pool2dOptions{}), "avg_pool2d");
  // A plane too large for the indices' 32-bit count (an expanded view: nothing is allocated).
  Tensor huge = f32({1, 1, 1, 1}).expand({1, 1, 65536, 65537});
  EXPECT_OPFORGE_ERROR(opforge::max_pool2d_with_indices(huge, opforge::Pool2dOptions{}),
                       "max_pool2d_with_indices", "2^31");
}

TEST(Errors, UnknownOpByName) {
  Tensor x = f32({3});
  EXPECT_THROW(opforge::elementwise("no_such_op", {x}), Error);
  EXPECT_OPFORGE_ERROR(opforge::elementwise("no_such_op", {x}), "no_such_op");
  EXPECT_OPFORGE_ERROR(opforge::reduction("no_such_reduction", x, {}, false), "no_such_reduction");
  EXPECT_OPFORGE_ERROR(opforge::op_info("no_such_op"), "no_such_op");
  EXPECT_EQ(opforge::find_op("no_such_op"), nullptr);
  // a known op called with the wrong number of inputs or attributes
  EXPECT_OPFORGE_ERROR(opforge::elementwise("add", {x}), "add", "2");
  EXPECT_OPFORGE_ERROR(opforge::elementwise("clip", {x}, {1.0}), "clip");
  // an op of another family through the elementwise entry point
  EXPECT_OPFORGE_ERROR(opforge::elementwise("sum", {x}), "sum");
}

TEST(Errors, ReductionOverAnEmptyAxis) {
  Tensor e = Tensor::zeros({0, 3});
  EXPECT_THROW(opforge::max(e, {0}), Error);
  EXPECT_OPFORGE_ERROR(opforge::max(e, {0}), "max");
  EXPECT_OPFORGE_ERROR(opforge::min(e), "min");
  EXPECT_OPFORGE_ERROR(opforge::argmax(e, 0), "argmax");
  EXPECT_OPFORGE_ERROR(opforge::argmin(e), "argmin");
}

TEST(Errors, MiscellaneousInputChecks) {
  Tensor x = f32({4, 5});
  EXPECT_OPFORGE_ERROR(opforge::layer_norm(x, {6}), "layer_norm", "[6]");
  EXPECT_OPFORGE_ERROR(opforge::layer_norm(x, {5}, f32({4})), "layer_norm");
  // batch_norm: an integer input, a weight of another channel count, one value per channel in
  // training, evaluation without running statistics.
  EXPECT_OPFORGE_ERROR(opforge::batch_norm(Tensor::zeros({4, 5}, DType::Int32), {}, {}),
                       "batch_norm", "int32");
  EXPECT_OPFORGE_ERROR(opforge::batch_norm(x, {}, {}, f32({4})), "batch_norm", "(5)");
  EXPECT_OPFORGE_ERROR(opforge::batch_norm(f32({1, 5}), {}, {}), "batch_norm", "more than one");
  EXPECT_OPFORGE_ERROR(opforge::batch_norm(x, {}, {}, {}, {}, false), "batch_norm", "running_mean");
  EXPECT_OPFORGE_ERROR(opforge::concat({x, f32({4, 6})}, 0), "concat");
  EXPECT_OPFORGE_ERROR(opforge::concat({}, 0), "concat");
  EXPECT_OPFORGE_ERROR(opforge::add(Tensor(), x), "add");
  EXPECT_OPFORGE_ERROR(Tensor::empty({2, -1}), "empty");
  EXPECT_OPFORGE_ERROR(Tensor::empty({int64_t(1) << 40, int64_t(1) << 40}), "empty",
                       "more elements than any memory can hold");
  // No elements, whatever the other dims: a valid tensor (its strides are never used).
  EXPECT_EQ(Tensor::empty({0, int64_t(1) << 40, int64_t(1) << 40}).numel(), 0);
  EXPECT_OPFORGE_ERROR(x.expand({3, 5}), "expand");
  EXPECT_OPFORGE_ERROR(Tensor::rand({3}, DType::Int32), "rand", "int32");
  Tensor idx = Tensor::from_vector<int64_t>({0, 3}, {2});
  EXPECT_OPFORGE_ERROR(opforge::index_add(x, 1, idx, f32({4, 3})), "index_add", "[4, 3]", "[4, 2]");
  EXPECT_OPFORGE_ERROR(
      opforge::index_add(x, 1, Tensor::from_vector<int64_t>({5}, {1}), f32({4, 1})), "index_add",
      "5", "size 5");
  EXPECT_OPFORGE_ERROR(opforge::index_add(Tensor::zeros({4, 5}, DType::Int32), 1, idx, f32({4, 2})),
                       "index_add", "float32", "int32");
  EXPECT_OPFORGE_ERROR(opforge::index_add(x, 1, f32({2}), f32({4, 2})), "index_add", "int64");
}

// Shape arithmetic is checked: int64 overflow, non-finite numbers and tensors too large for the
// kernels' 32-bit indexing are errors naming the op, never a wrapped size.
TEST(Errors, ShapeArithmeticIsChecked) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_OPFORGE_ERROR(Tensor::arange(NAN, 3), "arange", "finite");
  EXPECT_OPFORGE_ERROR(Tensor::arange(0, INFINITY), "arange", "finite");
  EXPECT_OPFORGE_ERROR(Tensor::arange(0, 1, NAN), "arange", "finite");
  EXPECT_OPFORGE_ERROR(Tensor::arange(0, 1e30, 1e-30), "arange", "more than any memory");
  // Views of 2^62 elements cost no memory, so sizes near the limit are reachable.
  Tensor big = f32({1}).expand({int64_t(1) << 62});
  EXPECT_OPFORGE_ERROR(opforge::concat({big, big}, 0), "concat", "overflows int64");
  EXPECT_OPFORGE_ERROR(opforge::pad(f32({2}), {{kMax - 1, 5}}), "pad", "overflows int64");
  // A view whose element count overflows is refused when it is made (as PyTorch does).
  EXPECT_OPFORGE_ERROR(f32({1, 1}).expand({int64_t(1) << 40, int64_t(1) << 40}),
                       "more than 2^63 elements");
  opforge::Conv2dOptions o;
  o.dilation = {int64_t(1) << 62, 1};
  EXPECT_OPFORGE_ERROR(opforge::conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, o), "conv2d",
                       "overflows int64");
  // Extreme slice bounds and steps clamp as in Python, without overflow.
  Tensor x = f32({10});
  EXPECT_EQ(x.slice(0, std::numeric_limits<int64_t>::min(), kMax).numel(), 10);
  EXPECT_EQ(x.slice(0, 0, 10, kMax).numel(), 1);
  EXPECT_EQ(x.slice(0, -kMax, -kMax).numel(), 0);
}

}  // namespace
