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
// Sums of float32 accumulate in float64. A float32 running sum stops growing once it is 2^24 times
// the addend (20 million ones would sum to 16777216); NumPy's pairwise and PyTorch's cascade
// summation avoid that, and so does the wider accumulator, at no cost to a loop bound by memory.
inline Halide::Type acc_type(const Halide::Type& t) {
  return t == Halide::Float(32) ? Halide::Float(64) : t;
}
inline Expr acc_sum(const Expr& e) { return Halide::sum(Halide::cast(acc_type(e.type()), e)); }
// In the accumulator's type.
inline Expr mean(const RedArgs& a) {
  return acc_sum(a.x(a.r)) / Halide::cast(acc_type(a.type), a.n);
}
inline Expr sum_exp_shifted(const RedArgs& a, const Expr& m) {
  return Halide::cast(a.type, acc_sum(Halide::exp(a.x(a.r) - m)));
}
// The row's log-sum-exp, from its finite max.
inline Expr lse(const RedArgs& a) {
  Expr m = finite_max(a);
  return m + Halide::log(sum_exp_shifted(a, m));
}
// softmax at kk: a product with the row's reciprocal, one division per row instead of one per
// element.
inline Expr softmax_at(const RedArgs& a, const Expr& kk) {
  Expr m = finite_max(a);
  return Halide::exp(a.x(kk) - m) * (Halide::cast(a.type, 1) / sum_exp_shifted(a, m));
}
inline Expr nan_aware(const RedArgs& a, const Expr& v) {
  return a.type.is_float() ? select(any_nan(a), Halide::cast(a.type, NAN), v) : v;
}
// The gradient of max or min (the row's extremum m) at k, given the result's gradient (like[0],
// constant along the row): shared evenly among the elements equal to m (PyTorch's amax/amin), and
// a NaN result's among the NaNs, as torch.max(x) without a dim does (amax over dims makes that
// row NaN). The NaN test comes first: Halide 14 compares floats as unordered-or-equal.
inline Expr extremum_grad(const RedArgs& a, const Expr& extremum) {
  Expr m = nan_aware(a, extremum);
  auto ties = [&](const Expr& kk) {
    return select(Halide::is_nan(m), Halide::is_nan(a.x(kk)), a.x(kk) == m);
  };
  Expr count = Halide::sum(Halide::cast(a.type, ties(a.r)));
  return select(ties(a.k), a.like_at(0, a.k) / count, Halide::cast(a.type, 0));
}
// batch_norm's 1 / sqrt(var + eps) of a channel's variance, in the accumulator's type.
inline Expr rstd_of(const RedArgs& a, const Expr& var) {
  Halide::Type acc = acc_type(a.type);
  return 1 / Halide::sqrt(Halide::cast(acc, var) + Halide::cast(acc, a.attr["eps"]));
}
}  // namespace detail

inline const auto reduction_ops = hana::make_tuple(
    reduce(
        "sum", numeric,
        [](const RedArgs& a) {
          return Halide::cast(a.out_type, detail::acc_sum(Halide::cast(a.out_type, a.x(a.r))));
        },
        widen_int),
    reduce("mean", floats, [](const RedArgs& a) { return Halide::cast(a.type, detail::mean(a)); }),
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
    reduce("logsumexp", floats, [](const RedArgs& a) { return detail::lse(a); }),
    reduce(
        "var", floats,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr d = Halide::cast(acc, a.x(a.r)) - detail::mean(a);
          return Halide::cast(a.type, detail::acc_sum(d * d) / (Halide::cast(acc, a.n) -
                                                                Halide::cast(acc, a.attr["ddof"])));
        },
        same, "ddof"),
    normalize("softmax", floats, [](const RedArgs& a) { return detail::softmax_at(a, a.k); }),
    normalize("log_softmax", floats,
              [](const RedArgs& a) {
                Expr m = detail::finite_max(a);
                return a.x(a.k) - m - Halide::log(detail::sum_exp_shifted(a, m));
              }),
    // Their gradients, from the result y (in) and its gradient g (like[0]), with the row's sum in
    // the accumulator's type: softmax's is y (g - sum(g y)), log_softmax's g - exp(y) sum(g).
    normalize_like("softmax_backward", floats, 1,
                   [](const RedArgs& a) {
                     Expr dot = Halide::cast(a.type, detail::acc_sum(a.like_at(0, a.r) * a.x(a.r)));
                     return a.x(a.k) * (a.like_at(0, a.k) - dot);
                   }),
    normalize_like("log_softmax_backward", floats, 1,
                   [](const RedArgs& a) {
                     return a.like_at(0, a.k) -
                            Halide::exp(a.x(a.k)) *
                                Halide::cast(a.type, detail::acc_sum(a.like_at(0, a.r)));
                   }),
    // Cross-entropy of the scores x (in) against a target distribution p (like[0]) over the
    // classes, one pass per row: -sum p log_softmax(x) = sum p (lse(x) - x). A class the target
    // gives nothing adds nothing, even at a score of -inf (0 * inf would be a NaN).
    reduce_like("cross_entropy", floats, 1,
                [](const RedArgs& a) {
                  Expr pr = a.like_at(0, a.r);
                  Expr term = Halide::select(pr == 0, Halide::cast(a.type, 0),
                                             pr * (detail::lse(a) - a.x(a.r)));
                  return Halide::cast(a.type, detail::acc_sum(term));
                }),
    // Its gradient for the scores, given the rows' loss gradients g (like[1], constant along a
    // row): (softmax(x) sum(p) - p) g, in one kernel.
    normalize_like("cross_entropy_backward", floats, 2,
                   [](const RedArgs& a) {
                     Expr mass = Halide::cast(a.type, detail::acc_sum(a.like_at(0, a.r)));
                     return (detail::softmax_at(a, a.k) * mass - a.like_at(0, a.k)) *
                            a.like_at(1, a.k);
                   }),
    // The gradients of the reductions above whose adjoint spreads over the row, from x (in) and
    // the result's gradient g (like[0], constant along the row); sum's and mean's are g itself.
    normalize_like(
        "max_backward", floats, 1,
        [](const RedArgs& a) { return detail::extremum_grad(a, Halide::maximum(a.x(a.r))); }),
    normalize_like(
        "min_backward", floats, 1,
        [](const RedArgs& a) { return detail::extremum_grad(a, Halide::minimum(a.x(a.r))); }),
    // prod's: g times the product of the row's other elements, exact at zeros (PyTorch's rule):
    // with z zeros in the row and p the product of its non-zero elements, g p / x where z = 0;
    // g p at the one zero and 0 elsewhere where z = 1; 0 where z > 1.
    normalize_like("prod_backward", floats, 1,
                   [](const RedArgs& a) {
                     Expr zero = Halide::cast(a.type, 0), xk = a.x(a.k);
                     Expr p = Halide::product(
                         select(a.x(a.r) == zero, Halide::cast(a.type, 1), a.x(a.r)));
                     Expr z = Halide::sum(Halide::cast(Halide::Int(32), a.x(a.r) == zero));
                     Expr g = a.like_at(0, a.k);
                     // g p zero, not zero: an inf or NaN among the others gives NaN, as the
                     // product of the others would.
                     return select(z == 0, g * p / xk, z == 1 && xk == zero, g * p, g * p * zero);
                   }),
    // logsumexp's: g softmax(x).
    normalize_like("logsumexp_backward", floats, 1,
                   [](const RedArgs& a) { return a.like_at(0, a.k) * detail::softmax_at(a, a.k); }),
    // var's: g 2 (x - mean) / (n - ddof), in the accumulator's type.
    normalize_like(
        "var_backward", floats, 1,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr d = Halide::cast(acc, a.x(a.k)) - detail::mean(a);
          return Halide::cast(a.type,
                              Halide::cast(acc, a.like_at(0, a.k)) * 2 * d /
                                  (Halide::cast(acc, a.n) - Halide::cast(acc, a.attr["ddof"])));
        },
        "ddof"),
    // Layer normalisation on the view (D, rows, 1) of x (rows, D), D the normalised dims: each
    // row's mean and rstd = 1 / sqrt(var + eps) (outputs of shape (rows), saved for the backward
    // pass as PyTorch saves them) and the normalised tensor from them. Extra inputs weight(i),
    // bias(i) over the row's elements; attribute eps.
    row_normalize(
        "layer_norm", floats, 0,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr n = Halide::cast(acc, a.count);
          Expr mu = detail::acc_sum(a.x_across()) / n;
          Expr d = Halide::cast(acc, a.x_across()) - mu;
          return Halide::Tuple(
              mu, 1 / Halide::sqrt(detail::acc_sum(d * d) / n + Halide::cast(acc, a.attr["eps"])));
        },
        [](const RedArgs& a) {
          Expr mean = a.channel(a.k)[0], rstd = a.channel(a.k)[1];
          return (a.x(a.k) - mean) * rstd * a.extra[0](a.i) + a.extra[1](a.i);
        },
        "eps", 2),
    // Its gradient for the input, from x, the result's gradient g (like[0]) and the forward's
    // saved mean(k), rstd(k) and the weight(i) (extra): with xhat = (x - mean) rstd and
    // gw = g weight, rstd (gw - mean(gw) - xhat mean(gw xhat)). The row sums of gw xhat and gw
    // (in the accumulator's type) are its per-row outputs.
    row_normalize(
        "layer_norm_backward", floats, 1,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr gw = a.like_across(0) * a.extra[2](a.across.x);
          Expr xhat = (a.x_across() - a.extra[0](a.k)) * a.extra[1](a.k);
          return Halide::Tuple(detail::acc_sum(Halide::cast(acc, gw * xhat)),
                               detail::acc_sum(Halide::cast(acc, gw)));
        },
        [](const RedArgs& a) {
          Expr n = Halide::cast(a.type, a.count), rstd = a.extra[1](a.k);
          Expr xhat = (a.x(a.k) - a.extra[0](a.k)) * rstd;
          Expr gw = a.like_at(0, a.k) * a.extra[2](a.i);
          return rstd * (gw - a.channel(a.k)[1] / n - xhat * (a.channel(a.k)[0] / n));
        },
        "", 3),
    // Its weight's and bias's gradients, from x and g (like[0]) on layer_norm's view (1, D, rows)
    // and the rows' saved mean and rstd (extra, indexed by the row): per k of the normalised dims
    // D, the sums over the rows of g xhat (the weight's) and of g (the bias's).
    per_channel(
        "layer_norm_backward_reduce", floats, 1,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr row = a.across.y, g = a.like_across(0);
          Expr xhat = (a.x_across() - a.extra[0](row)) * a.extra[1](row);
          return Halide::Tuple(detail::acc_sum(Halide::cast(acc, g * xhat)),
                               detail::acc_sum(Halide::cast(acc, g)));
        },
        "", 2),
    // Batch normalisation on the view in(i, k, o) with k the channels (NCHW: i = H x W, o = N);
    // each channel's statistics are over i and o. In training, one kernel: the batch's mean and
    // biased variance per channel (outputs of shape (k)) and the normalised tensor from them.
    // extra inputs: weight(k), bias(k); attribute eps.
    channel_normalize(
        "batch_norm_train", floats, 0,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr n = Halide::cast(acc, a.count);
          Expr mu = detail::acc_sum(a.x_across()) / n;
          Expr d = Halide::cast(acc, a.x_across()) - mu;
          return Halide::Tuple(mu, detail::acc_sum(d * d) / n);
        },
        [](const RedArgs& a) {
          Expr mean = a.channel(a.k)[0], var = a.channel(a.k)[1];
          Expr scale = Halide::cast(a.type, detail::rstd_of(a, var)) * a.extra[0](a.k);
          return (a.x(a.k) - mean) * scale + a.extra[1](a.k);
        },
        "eps", 2),
    // The normalisation from given statistics (the running ones, in evaluation): extra inputs
    // mean(k), var(k), weight(k), bias(k); attribute eps.
    normalize(
        "batch_norm", floats,
        [](const RedArgs& a) {
          Expr scale = Halide::cast(a.type, detail::rstd_of(a, a.extra[1](a.k))) * a.extra[2](a.k);
          return (a.x(a.k) - a.extra[0](a.k)) * scale + a.extra[3](a.k);
        },
        "eps", 4),
    // Its gradients in one kernel, from x, the result's gradient g (like[0]) and extra mean(k),
    // var(k), weight(k): per channel sum(g xhat) (the weight's gradient) and sum(g) (the bias's),
    // xhat = (x - mean) rstd; and x's, weight rstd (g - sum(g) / n - xhat sum(g xhat) / n) over the
    // n values of a channel in training (attribute training = 1: the statistics depend on x), or
    // weight rstd g through fixed (running) statistics (training = 0).
    channel_normalize(
        "batch_norm_backward", floats, 1,
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr g = Halide::cast(acc, a.like_across(0));
          Expr xhat = (Halide::cast(acc, a.x_across()) - Halide::cast(acc, a.extra[0](a.k))) *
                      detail::rstd_of(a, a.extra[1](a.k));
          return Halide::Tuple(detail::acc_sum(g * xhat), detail::acc_sum(g));
        },
        [](const RedArgs& a) {
          Halide::Type acc = detail::acc_type(a.type);
          Expr n = Halide::cast(acc, a.count);
          Expr rstd = detail::rstd_of(a, a.extra[1](a.k));
          Expr xhat = (Halide::cast(acc, a.x(a.k)) - Halide::cast(acc, a.extra[0](a.k))) * rstd;
          Expr sums = Halide::cast(acc, a.channel(a.k)[1]) / n +
                      xhat * Halide::cast(acc, a.channel(a.k)[0]) / n;
          Expr g = Halide::cast(acc, a.like_at(0, a.k));
          Expr dx = Halide::cast(acc, a.extra[2](a.k)) * rstd *
                    (g - Halide::select(a.attr["training"] != 0, sums, Halide::cast(acc, 0)));
          return Halide::cast(a.type, dx);
        },
        "eps,training:i", 3));

}  // namespace opforge::ops
