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
// The fraction k = a + (1/2) / (a + 1 / (a + ...)) is evaluated as P / Q from its convergents'
// recurrence (P_n = a P_n+1 + n/2 Q_n+1, Q_n = P_n+1: every term positive, one division): written
// as 20 nested divisions, Halide 14 took minutes to compile the float64 kernel at 2 lanes (SSE4.1)
// while its bounds grew with each level.
inline Expr erf_f64(const Expr& x) {
  Expr a = Halide::abs(x), a2 = a * a;
  Expr term = a, sum = a;
  for (int n = 1; n < 45; n++) {
    term = term * (2 * a2 / (2 * n + 1));
    sum = sum + term;
  }
  Expr series = constant(x.type(), 2 / std::sqrt(M_PI)) * Halide::exp(-a2) * sum;
  Expr p = a, q = Expr(1.0);
  for (int n = 20; n >= 1; n--) {
    Expr next = a * p + Expr(n / 2.0) * q;
    q = p;
    p = next;
  }
  Expr k = p / q;
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
inline Expr ieee_equal(const Expr& a, const Expr& b) {
  if (!a.type().is_float()) return a == b;
  return a == b && !Halide::is_nan(a) && !Halide::is_nan(b);
}
inline Expr ieee_eq(const EwArgs& a) { return ieee_equal(a[0], a[1]); }
inline Expr truthy(const Expr& e) { return e != Halide::cast(e.type(), 0); }

// Forward math that a stated derivative reuses.
inline Expr zero(const Expr& x) { return Halide::cast(x.type(), 0); }
inline Expr tanh_of(const Expr& x) {
  return special(x, Halide::tanh(Halide::clamp(x, -20, 20)), 1, -1);
}
inline Expr sigmoid_of(const Expr& x) { return 1 / (1 + safe_exp(-x)); }
inline Expr sin_of(const Expr& x) { return special(x, Halide::sin(x), NAN, NAN); }
inline Expr cos_of(const Expr& x) { return special(x, Halide::cos(x), NAN, NAN); }
inline Expr gelu_cdf(const Expr& x) {
  return Halide::cast(x.type(), Expr(0.5)) * (1 + erf_any(x * constant(x.type(), M_SQRT1_2)));
}

// Stated derivatives (PyTorch's conventions, tools/autograd/derivatives.yaml): each returns the
// gradient of every non-bool input, given the inputs `a` and the result's gradient `g`.
using Grads = std::vector<Expr>;
// maximum/minimum: the larger (smaller) input gets the gradient; at a tie each gets half.
inline Grads tie_split(const EwArgs& a, const Expr& g, bool maximum) {
  Expr half = g * Halide::cast(a.type, Expr(0.5)), z = zero(g);
  Expr a_loses = maximum ? a[0] < a[1] : a[0] > a[1];
  Expr b_loses = maximum ? a[0] > a[1] : a[0] < a[1];
  Expr tie = ieee_equal(a[0], a[1]);
  return {select(tie, half, a_loses, z, g), select(tie, half, b_loses, z, g)};
}
}  // namespace detail

// Each op's gradient is derived by Halide unless the op states it (with_grad) or it is zero
// (zero_grad); see DerivedGrad in dsl/op.hpp. Stated: kinks and ties where PyTorch picks a side
// (abs, relu, leaky_relu, elu at 0; clip at its bounds; maximum, minimum at ties), special values
// a clamped forward would zero (exp, log, sin past overflow or the domain), approximations (erf,
// gelu, tanh, sigmoid), and pow at a zero base.
inline const auto elementwise_ops = hana::make_tuple(
    unary("neg", signed_numeric, [](const EwArgs& a) { return -a[0]; }),
    with_grad(unary("abs", numeric, [](const EwArgs& a) { return select(a[0] < 0, -a[0], a[0]); }),
              [](const EwArgs& a, const Expr& g) {
                return detail::Grads{select(a[0] > 0, g, a[0] < 0, -g, detail::zero(g))};
              }),
    with_grad(
        unary("exp", floats, [](const EwArgs& a) { return detail::safe_exp(a[0]); }),
        [](const EwArgs& a, const Expr& g) { return detail::Grads{g * detail::safe_exp(a[0])}; }),
    with_grad(unary("log", floats, [](const EwArgs& a) { return detail::safe_log(a[0]); }),
              [](const EwArgs& a, const Expr& g) { return detail::Grads{g / a[0]}; }),
    with_grad(unary("log1p", floats, [](const EwArgs& a) { return detail::log1p_any(a[0]); }),
              [](const EwArgs& a, const Expr& g) { return detail::Grads{g / (1 + a[0])}; }),
    with_grad(
        unary("expm1", floats, [](const EwArgs& a) { return detail::expm1_any(a[0]); }),
        [](const EwArgs& a, const Expr& g) { return detail::Grads{g * detail::safe_exp(a[0])}; }),
    unary("sqrt", floats, [](const EwArgs& a) { return Halide::sqrt(a[0]); }),
    unary("rsqrt", floats, [](const EwArgs& a) { return 1 / Halide::sqrt(a[0]); }),
    unary("reciprocal", floats, [](const EwArgs& a) { return 1 / a[0]; }),
    with_grad(
        unary("sin", floats, [](const EwArgs& a) { return detail::sin_of(a[0]); }),
        [](const EwArgs& a, const Expr& g) { return detail::Grads{g * detail::cos_of(a[0])}; }),
    with_grad(
        unary("cos", floats, [](const EwArgs& a) { return detail::cos_of(a[0]); }),
        [](const EwArgs& a, const Expr& g) { return detail::Grads{-g * detail::sin_of(a[0])}; }),
    with_grad(unary("tanh", floats, [](const EwArgs& a) { return detail::tanh_of(a[0]); }),
              [](const EwArgs& a, const Expr& g) {
                Expr y = detail::tanh_of(a[0]);
                return detail::Grads{g * (1 - y * y)};
              }),
    with_grad(unary("sigmoid", floats, [](const EwArgs& a) { return detail::sigmoid_of(a[0]); }),
              [](const EwArgs& a, const Expr& g) {
                Expr y = detail::sigmoid_of(a[0]);
                return detail::Grads{g * y * (1 - y)};
              }),
    with_grad(
        unary("relu", numeric,
              [](const EwArgs& a) { return select(a[0] < 0, Halide::cast(a.type, 0), a[0]); }),
        [](const EwArgs& a, const Expr& g) {
          return detail::Grads{select(a[0] > 0, g, detail::zero(g))};
        }),
    with_grad(
        unary_attr("leaky_relu", floats, "alpha",
                   [](const EwArgs& a) { return select(a[0] < 0, a[0] * a.attr["alpha"], a[0]); }),
        [](const EwArgs& a, const Expr& g) {
          return detail::Grads{select(a[0] > 0, g, g * a.attr["alpha"])};
        }),
    with_grad(unary_attr("elu", floats, "alpha",
                         [](const EwArgs& a) {
                           return select(a[0] < 0, a.attr["alpha"] * detail::expm1_any(a[0]), a[0]);
                         }),
              [](const EwArgs& a, const Expr& g) {
                return detail::Grads{
                    select(a[0] > 0, g, g * a.attr["alpha"] * detail::safe_exp(a[0]))};
              }),
    with_grad(unary("gelu", floats,
                    [](const EwArgs& a) {
                      return a[0] * Halide::cast(a.type, Expr(0.5)) *
                             (1 + detail::erf_any(a[0] * detail::constant(a.type, M_SQRT1_2)));
                    }),
              // d/dx x Phi(x) = Phi(x) + x phi(x)
              [](const EwArgs& a, const Expr& g) {
                Expr x = a[0], pdf = detail::constant(a.type, 1 / std::sqrt(2 * M_PI)) *
                                     detail::safe_exp(-x * x * Halide::cast(a.type, Expr(0.5)));
                return detail::Grads{g * (detail::gelu_cdf(x) + x * pdf)};
              }),
    // PyTorch's softplus passes the gradient unchanged above its threshold of 20.
    with_grad(unary("softplus", floats,
                    [](const EwArgs& a) {
                      return select(a[0] > 0, a[0], Halide::cast(a.type, 0)) +
                             detail::log1p_any(detail::safe_exp(-Halide::abs(a[0])));
                    }),
              [](const EwArgs& a, const Expr& g) {
                return detail::Grads{select(a[0] > 20, g, g * detail::sigmoid_of(a[0]))};
              }),
    with_grad(
        unary("erf", floats,
              [](const EwArgs& a) { return detail::special(a[0], detail::erf_any(a[0]), 1, -1); }),
        [](const EwArgs& a, const Expr& g) {
          return detail::Grads{g * detail::constant(a.type, 2 / std::sqrt(M_PI)) *
                               detail::safe_exp(-a[0] * a[0])};
        }),
    zero_grad(unary("floor", floats, [](const EwArgs& a) { return Halide::floor(a[0]); })),
    zero_grad(unary("ceil", floats, [](const EwArgs& a) { return Halide::ceil(a[0]); })),
    zero_grad(
        unary("round", floats, [](const EwArgs& a) { return detail::round_half_even(a[0]); })),
    zero_grad(unary("sign", numeric,
                    [](const EwArgs& a) {
                      Expr zero = Halide::cast(a.type, 0), one = Halide::cast(a.type, 1);
                      return select(a[0] > zero, one, a[0] < zero, -one, a[0]);
                    })),
    // The gradient passes where min <= x <= max, bounds included (PyTorch's clamp).
    with_grad(unary_attr("clip", numeric, "min,max",
                         [](const EwArgs& a) {
                           return select(a[0]<a.attr["min"], a.attr["min"], a[0]> a.attr["max"],
                                         a.attr["max"], a[0]);
                         }),
              [](const EwArgs& a, const Expr& g) {
                return detail::Grads{
                    select(a[0] >= a.attr["min"] && a[0] <= a.attr["max"], g, detail::zero(g))};
              }),
    // PyTorch's pow: no gradient to the base where the exponent is 0, none to the exponent where
    // the base is 0 (log 0 would make it NaN).
    with_grad(binary("pow", floats, [](const EwArgs& a) { return Halide::pow(a[0], a[1]); }),
              [](const EwArgs& a, const Expr& g) {
                Expr z = detail::zero(g);
                return detail::Grads{select(a[1] == 0, z, g * a[1] * Halide::pow(a[0], a[1] - 1)),
                                     select(a[0] == 0 && a[1] >= 0, z,
                                            g * Halide::pow(a[0], a[1]) * detail::safe_log(a[0]))};
              }),
    binary("add", numeric, [](const EwArgs& a) { return a[0] + a[1]; }),
    binary("sub", numeric, [](const EwArgs& a) { return a[0] - a[1]; }),
    binary("mul", numeric, [](const EwArgs& a) { return a[0] * a[1]; }),
    binary("div", numeric, detail::py_div),
    with_grad(binary("maximum", numeric, detail::nan_max),
              [](const EwArgs& a, const Expr& g) { return detail::tie_split(a, g, true); }),
    with_grad(binary("minimum", numeric, detail::nan_min),
              [](const EwArgs& a, const Expr& g) { return detail::tie_split(a, g, false); }),
    binary("mod", numeric, detail::py_mod), compare("eq", all_types, detail::ieee_eq),
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
                   return std::vector<Expr>{detail::sin_of(a[0]), detail::cos_of(a[0])};
                 }),
    in_place("axpy_", 2, 0, floats, "alpha",
             [](const EwArgs& a) { return a[0] + a.attr["alpha"] * a[1]; }),
    // Optimiser steps: a parameter and its state updated in one pass, by PyTorch's rules (its
    // torch/optim/{sgd,adam,adamw}.py). Inputs: the parameter, its gradient, then its state; the
    // runtime passes the step's scalars, Adam's bias corrections among them.
    updates("sgd_", 2, 0b1, floats, "lr,weight_decay",
            [](const EwArgs& a) {
              return std::vector<Expr>{a[0] -
                                       a.attr["lr"] * (a[1] + a.attr["weight_decay"] * a[0])};
            }),
    // The momentum buffer starts as the first step's gradient (`first`), then
    // buf = momentum * buf + (1 - dampening) * d; Nesterov steps along d + momentum * buf.
    updates(
        "sgd_momentum_", 3, 0b101, floats, "lr,momentum,dampening,weight_decay,nesterov:i,first:i",
        [](const EwArgs& a) {
          Expr d = a[1] + a.attr["weight_decay"] * a[0], mom = a.attr["momentum"];
          Expr buf =
              Halide::select(a.attr["first"] != 0, d, mom * a[2] + (1 - a.attr["dampening"]) * d);
          Expr step = Halide::select(a.attr["nesterov"] != 0, d + mom * buf, buf);
          return std::vector<Expr>{a[0] - a.attr["lr"] * step, buf};
        }),
    // Adam (weight decay added to the gradient) or AdamW (`decoupled`: the parameter decays by
    // lr * weight_decay first); bias_correction1/2 are 1 - beta^step.
    updates("adam_", 4, 0b1101, floats,
            "lr,beta1,beta2,eps,weight_decay,decoupled:i,bias_correction1,bias_correction2",
            [](const EwArgs& a) {
              Expr decoupled = a.attr["decoupled"] != 0, lr = a.attr["lr"],
                   wd = a.attr["weight_decay"], b1 = a.attr["beta1"], b2 = a.attr["beta2"];
              Expr g = Halide::select(decoupled, a[1], a[1] + wd * a[0]);
              Expr p = Halide::select(decoupled, a[0] * (1 - lr * wd), a[0]);
              Expr m = b1 * a[2] + (1 - b1) * g, v = b2 * a[3] + (1 - b2) * g * g;
              Expr denom =
                  Halide::sqrt(v) / Halide::sqrt(a.attr["bias_correction2"]) + a.attr["eps"];
              return std::vector<Expr>{p - lr / a.attr["bias_correction1"] * m / denom, m, v};
            }));

}  // namespace opforge::ops
