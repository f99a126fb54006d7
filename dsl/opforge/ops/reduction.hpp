// Reduction ops over the canonical (inner, reduced, outer) view; the runtime maps any set of axes
// onto it. `reduce` ops drop the reduced axis, `normalize` ops keep the input's shape.
#pragma once
#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;
using Halide::select;

namespace detail {
inline Expr any_nan(const RedArgs& a) {
  return Halide::maximum(Halide::cast(Halide::UInt(8), Halide::is_nan(a.x(a.r)))) != 0;
}
// The max over the reduced axis, 0 where it is infinite, so x - max stays finite.
inline Expr finite_max(const RedArgs& a) {
  Expr m = Halide::maximum(a.x(a.r));
  return select(Halide::is_finite(m), m, Halide::cast(a.type, 0));
}
inline Expr mean(const RedArgs& a) { return Halide::sum(a.x(a.r)) / Halide::cast(a.type, a.n); }
inline Expr nan_aware(const RedArgs& a, const Expr& v) {
  return a.type.is_float() ? select(any_nan(a), Halide::cast(a.type, NAN), v) : v;
}
}  // namespace detail

inline const auto reduction_ops = hana::make_tuple(
    reduce(
        "sum", numeric,
        [](const RedArgs& a) { return Halide::sum(Halide::cast(a.out_type, a.x(a.r))); },
        widen_int),
    reduce("mean", floats, [](const RedArgs& a) { return detail::mean(a); }),
    reduce(
        "prod", numeric,
        [](const RedArgs& a) { return Halide::product(Halide::cast(a.out_type, a.x(a.r))); },
        widen_int),
    reduce("max", numeric,
           [](const RedArgs& a) { return detail::nan_aware(a, Halide::maximum(a.x(a.r))); }),
    reduce("min", numeric,
           [](const RedArgs& a) { return detail::nan_aware(a, Halide::minimum(a.x(a.r))); }),
    reduce(
        "argmax", numeric, [](const RedArgs& a) { return Halide::argmax(a.r, a.x(a.r))[0]; },
        to_int64),
    reduce(
        "argmin", numeric, [](const RedArgs& a) { return Halide::argmin(a.r, a.x(a.r))[0]; },
        to_int64),
    reduce("logsumexp", floats,
           [](const RedArgs& a) {
             Expr m = detail::finite_max(a);
             return m + Halide::log(Halide::sum(Halide::exp(a.x(a.r) - m)));
           }),
    reduce(
        "var", floats,
        [](const RedArgs& a) {
          Expr d = a.x(a.r) - detail::mean(a);
          return Halide::sum(d * d) / (Halide::cast(a.type, a.n) - a.attr["ddof"]);
        },
        same, "ddof"),
    normalize("softmax", floats,
              [](const RedArgs& a) {
                Expr m = detail::finite_max(a);
                return Halide::exp(a.x(a.k) - m) / Halide::sum(Halide::exp(a.x(a.r) - m));
              }),
    normalize("log_softmax", floats,
              [](const RedArgs& a) {
                Expr m = detail::finite_max(a);
                return a.x(a.k) - m - Halide::log(Halide::sum(Halide::exp(a.x(a.r) - m)));
              }),
    // extra inputs: weight(k), bias(k); attribute: eps
    normalize(
        "layer_norm", floats,
        [](const RedArgs& a) {
          Expr mu = detail::mean(a);
          Expr d = a.x(a.r) - mu;
          Expr var = Halide::sum(d * d) / Halide::cast(a.type, a.n);
          return (a.x(a.k) - mu) / Halide::sqrt(var + a.attr["eps"]) * a.extra[0](a.k) +
                 a.extra[1](a.k);
        },
        "eps", 2));

}  // namespace opforge::ops
