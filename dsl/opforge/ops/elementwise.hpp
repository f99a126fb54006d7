// Elementwise ops: out = f(inputs) per element, with NumPy broadcasting done by the runtime.
#pragma once
#include <cstdint>
#include <cstring>

#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;
using Halide::select;

namespace detail {
// NaN-propagating max/min (NumPy maximum/minimum, PyTorch clamp semantics).
inline Expr nan_max(const EwArgs& a) {
  Expr m = select(a[0] > a[1], a[0], a[1]);
  return a.type.is_float()
             ? select(Halide::is_nan(a[0]), a[0], select(Halide::is_nan(a[1]), a[1], m))
             : m;
}
inline Expr nan_min(const EwArgs& a) {
  Expr m = select(a[0] < a[1], a[0], a[1]);
  return a.type.is_float()
             ? select(Halide::is_nan(a[0]), a[0], select(Halide::is_nan(a[1]), a[1], m))
             : m;
}
// A constant of type t. A float64 one is spelled as its bits: Halide 14's C and OpenCL C code
// generators print float constants through a 32-bit float, so 2/sqrt(pi) would reach an OpenCL
// float64 kernel correct to 7 digits only.
inline Expr constant(const Halide::Type& t, double v) {
  if (t != Halide::Float(64)) return Halide::cast(t, Expr(v));
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return Halide::reinterpret(t, Halide::Expr(bits));
}
// float64 erf without the C library, which GPU code cannot call (CUDA's PTX would leave erf
// unresolved): below 3 the series erf(x) = 2/sqrt(pi) exp(-x^2) sum 2^n x^(2n+1) / (2n+1)!!, whose
// terms are all positive (45 terms: 1e-15 relative); from 3 on, 1 - erfc(x) with erfc from its
// continued fraction (Laplace), 20 levels deep; from 6 on, 1. Float32 uses Halide's polynomial.
inline Expr erf_f64(const Expr& x) {
  Expr a = Halide::abs(x), a2 = a * a;
  Expr term = a, sum = a;
  for (int n = 1; n < 45; n++) {
    term = term * (2 * a2 / (2 * n + 1));
    sum = sum + term;
  }
  Expr series = constant(x.type(), 2 / std::sqrt(M_PI)) * Halide::exp(-a2) * sum;
  Expr k = a;
  for (int n = 20; n >= 1; n--) k = a + Expr(n / 2.0) / k;
  Expr tail = 1 - Halide::exp(-a2) / (constant(x.type(), std::sqrt(M_PI)) * k);
  Expr v = select(a < 3, series, a < 6, tail, Expr(1.0));
  return select(x < 0, -v, v);
}
inline Expr erf_any(const Expr& x) {
  return x.type() == Halide::Float(32) ? Halide::erf(Halide::clamp(x, -10, 10)) : erf_f64(x);
}
// Python/NumPy modulo: the result takes the divisor's sign. Halide's integer % is Euclidean
// (never negative) and its float % is already floor-based.
inline Expr py_mod(const EwArgs& a) {
  if (a.type.is_float()) return a[0] - a[1] * Halide::floor(a[0] / a[1]);
  Expr r = a[0] % a[1];
  return select(a[1] < 0 && r != 0, r + a[1], r);
}
// Floats: true division. Ints: floor division as Python's //; Halide's integer division is
// Euclidean, which differs for negative divisors.
inline Expr py_div(const EwArgs& a) {
  if (a.type.is_float()) return a[0] / a[1];
  Expr q = a[0] / a[1], r = a[0] % a[1];
  return select(a[1] < 0 && r != 0, q - 1, q);
}
// Halide's float32 exp, log, tanh, sin, erf are polynomials, exact only away from special
// values; these pin NaN, the infinities and overflow to IEEE results.
inline Expr inf_of(const Expr& x) { return Halide::cast(x.type(), INFINITY); }
inline Expr special(const Expr& x, const Expr& v, const Expr& at_pos_inf, const Expr& at_neg_inf) {
  return select(Halide::is_nan(x), x, x == inf_of(x), Halide::cast(x.type(), at_pos_inf),
                x == -inf_of(x), Halide::cast(x.type(), at_neg_inf), v);
}
inline Expr safe_exp(const Expr& x) {
  bool f32 = x.type() == Halide::Float(32);
  Expr hi = Halide::cast(x.type(), Expr(f32 ? 88.72 : 709.78)),
       lo = Halide::cast(x.type(), Expr(f32 ? -103.9 : -745.1));
  Expr zero = Halide::cast(x.type(), 0);
  return special(x, select(x > hi, inf_of(x), x < lo, zero, Halide::exp(x)), inf_of(x), zero);
}
inline Expr safe_log(const Expr& x) {
  Expr nan = Halide::cast(x.type(), NAN);
  return special(x, select(x < 0, nan, x == 0, -inf_of(x), Halide::log(x)), inf_of(x), nan);
}
// expm1 and log1p without the C library, which GPU code lacks (OpenCL C has no expm1f/log1pf, and
// CUDA's PTX would leave expm1/log1p unresolved): exp and log of either float type are enough.
inline Expr expm1_any(const Expr& x) {
  // Kahan: with u = exp(x) rounded, (u - 1) * x / log(u) cancels the rounding error of u.
  Expr u = safe_exp(x), um1 = u - 1, minus_one = Halide::cast(x.type(), -1);
  Expr v = select(u == 1, x, um1 == -1, minus_one, u == inf_of(x), u, um1 * x / Halide::log(u));
  return special(x, v, inf_of(x), minus_one);
}
inline Expr log1p_any(const Expr& x) {
  // Goldberg: log(u) * x / (u - 1) with u = 1 + x rounded.
  Expr u = 1 + x, nan = Halide::cast(x.type(), NAN);
  Expr v = select(u == 1, x, Halide::log(u) * x / (u - 1));
  return special(x, select(x < -1, nan, x == -1, -inf_of(x), v), inf_of(x), nan);
}
// Round half to even (NumPy, IEEE rint), spelled out: Halide 14's OpenCL backend emits OpenCL's
// round(), which rounds halves away from zero. Zero keeps the input's sign.
inline Expr round_half_even(const Expr& x) {
  Expr f = Halide::floor(x), d = x - f, half = Halide::cast(x.type(), Expr(0.5));
  Expr odd = f - 2 * Halide::floor(f * half) != 0;
  Expr r = select(d > half || (d == half && odd), f + 1, f);
  return select(r == 0, x * 0, r);
}
// Halide 14 compares floats as unordered-or-equal (NaN == x is true) even with strict_float;
// IEEE says a NaN equals nothing.
inline Expr ieee_eq(const EwArgs& a) {
  if (!a.type.is_float()) return a[0] == a[1];
  return a[0] == a[1] && !Halide::is_nan(a[0]) && !Halide::is_nan(a[1]);
}
inline Expr truthy(const Expr& e) { return e != Halide::cast(e.type(), 0); }
}  // namespace detail

inline const auto elementwise_ops = hana::make_tuple(
    unary("neg", signed_numeric, [](const EwArgs& a) { return -a[0]; }),
    unary("abs", numeric, [](const EwArgs& a) { return select(a[0] < 0, -a[0], a[0]); }),
    unary("exp", floats, [](const EwArgs& a) { return detail::safe_exp(a[0]); }),
    unary("log", floats, [](const EwArgs& a) { return detail::safe_log(a[0]); }),
    unary("log1p", floats, [](const EwArgs& a) { return detail::log1p_any(a[0]); }),
    unary("expm1", floats, [](const EwArgs& a) { return detail::expm1_any(a[0]); }),
    unary("sqrt", floats, [](const EwArgs& a) { return Halide::sqrt(a[0]); }),
    unary("rsqrt", floats, [](const EwArgs& a) { return 1 / Halide::sqrt(a[0]); }),
    unary("reciprocal", floats, [](const EwArgs& a) { return 1 / a[0]; }),
    unary("sin", floats,
          [](const EwArgs& a) { return detail::special(a[0], Halide::sin(a[0]), NAN, NAN); }),
    unary("cos", floats,
          [](const EwArgs& a) { return detail::special(a[0], Halide::cos(a[0]), NAN, NAN); }),
    unary("tanh", floats,
          [](const EwArgs& a) {
            return detail::special(a[0], Halide::tanh(Halide::clamp(a[0], -20, 20)), 1, -1);
          }),
    unary("sigmoid", floats, [](const EwArgs& a) { return 1 / (1 + detail::safe_exp(-a[0])); }),
    unary("relu", numeric,
          [](const EwArgs& a) { return select(a[0] < 0, Halide::cast(a.type, 0), a[0]); }),
    unary_attr("leaky_relu", floats, "alpha",
               [](const EwArgs& a) { return select(a[0] < 0, a[0] * a.attr["alpha"], a[0]); }),
    unary_attr("elu", floats, "alpha",
               [](const EwArgs& a) {
                 return select(a[0] < 0, a.attr["alpha"] * detail::expm1_any(a[0]), a[0]);
               }),
    unary("gelu", floats,
          [](const EwArgs& a) {
            return a[0] * Halide::cast(a.type, Expr(0.5)) *
                   (1 + detail::erf_any(a[0] * detail::constant(a.type, M_SQRT1_2)));
          }),
    unary("softplus", floats,
          [](const EwArgs& a) {
            return select(a[0] > 0, a[0], Halide::cast(a.type, 0)) +
                   detail::log1p_any(detail::safe_exp(-Halide::abs(a[0])));
          }),
    unary("erf", floats,
          [](const EwArgs& a) { return detail::special(a[0], detail::erf_any(a[0]), 1, -1); }),
    unary("floor", floats, [](const EwArgs& a) { return Halide::floor(a[0]); }),
    unary("ceil", floats, [](const EwArgs& a) { return Halide::ceil(a[0]); }),
    unary("round", floats, [](const EwArgs& a) { return detail::round_half_even(a[0]); }),
    unary("sign", numeric,
          [](const EwArgs& a) {
            Expr zero = Halide::cast(a.type, 0), one = Halide::cast(a.type, 1);
            return select(a[0] > zero, one, a[0] < zero, -one, a[0]);
          }),
    unary_attr("clip", numeric, "min,max",
               [](const EwArgs& a) {
                 return select(a[0]<a.attr["min"], a.attr["min"], a[0]> a.attr["max"],
                               a.attr["max"], a[0]);
               }),
    binary("pow", floats, [](const EwArgs& a) { return Halide::pow(a[0], a[1]); }),
    binary("add", numeric, [](const EwArgs& a) { return a[0] + a[1]; }),
    binary("sub", numeric, [](const EwArgs& a) { return a[0] - a[1]; }),
    binary("mul", numeric, [](const EwArgs& a) { return a[0] * a[1]; }),
    binary("div", numeric, detail::py_div), binary("maximum", numeric, detail::nan_max),
    binary("minimum", numeric, detail::nan_min), binary("mod", numeric, detail::py_mod),
    compare("eq", all_types, detail::ieee_eq),
    compare("ne", all_types, [](const EwArgs& a) { return !detail::ieee_eq(a); }),
    compare("lt", numeric, [](const EwArgs& a) { return a[0] < a[1]; }),
    compare("le", numeric, [](const EwArgs& a) { return a[0] <= a[1]; }),
    compare("gt", numeric, [](const EwArgs& a) { return a[0] > a[1]; }),
    compare("ge", numeric, [](const EwArgs& a) { return a[0] >= a[1]; }),
    binary("logical_and", bools,
           [](const EwArgs& a) { return detail::truthy(a[0]) && detail::truthy(a[1]); }),
    binary("logical_or", bools,
           [](const EwArgs& a) { return detail::truthy(a[0]) || detail::truthy(a[1]); }),
    binary("logical_xor", bools,
           [](const EwArgs& a) { return detail::truthy(a[0]) != detail::truthy(a[1]); }),
    unary("logical_not", bools, [](const EwArgs& a) { return !detail::truthy(a[0]); }),
    ElementwiseOp{"where", 3, all_types, "", same,
                  [](const EwArgs& a) { return select(detail::truthy(a[0]), a[1], a[2]); },
                  /*bool_inputs_mask=*/1},
    CastOp{"cast", all_types},
    // Several outputs and in-place buffers, as backward passes and optimiser steps need them.
    multi_output("sincos", 1, 2, floats,
                 [](const EwArgs& a) {
                   return std::vector<Expr>{detail::special(a[0], Halide::sin(a[0]), NAN, NAN),
                                            detail::special(a[0], Halide::cos(a[0]), NAN, NAN)};
                 }),
    in_place("axpy_", 2, 0, floats, "alpha",
             [](const EwArgs& a) { return a[0] + a.attr["alpha"] * a[1]; }));

}  // namespace opforge::ops
