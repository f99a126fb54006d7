// A user's own ops, written with the opforge DSL exactly like the built-in ones. The build
// (opforge_add_ops in CMakeLists.txt) generates their kernels in every variant.
#pragma once
#include "opforge/dsl/op.hpp"

namespace my_ops {
using namespace opforge::dsl;

inline const auto ops = hana::make_tuple(
    // swish(x) = x * sigmoid(x)
    unary("swish", floats, [](const EwArgs& a) { return a[0] / (1 + Halide::exp(-a[0])); }),
    // hard_tanh with a configurable bound: clamp(x, -bound, bound)
    unary_attr(
        "hard_tanh", floats, "bound",
        [](const EwArgs& a) { return Halide::clamp(a[0], -a.attr["bound"], a.attr["bound"]); }),
    // sum of squares over the reduced axes
    reduce("sum_squares", floats,
           [](const RedArgs& a) { return Halide::sum(a.x(a.r) * a.x(a.r)); }));

}  // namespace my_ops
