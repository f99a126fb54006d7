// Contraction ops: batched matrix products (B, M, K) x (B, K, N); the runtime broadcasts batch
// dimensions (stride 0) and materialises transposes that no op reads as they are.
#pragma once
#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;

namespace detail {
inline Func product(const ContractionArgs& a) {
  Func acc("acc");
  acc(a.n, a.m, a.batch) = Halide::cast(a.type, 0);
  acc(a.n, a.m, a.batch) += a.a(a.r, a.m, a.batch) * a.b(a.n, a.r, a.batch);
  return acc;
}
}  // namespace detail

inline const auto contraction_ops = hana::make_tuple(
    contraction("matmul", floats, "", false,
                [](const ContractionArgs& a) {
                  Func acc = detail::product(a), out("out");
                  out(a.n, a.m, a.batch) = acc(a.n, a.m, a.batch);
                  return AccOut{acc, out};
                }),
    // out = alpha * A B + beta * C
    contraction("gemm", floats, "alpha,beta", true,
                [](const ContractionArgs& a) {
                  Func acc = detail::product(a), out("out");
                  out(a.n, a.m, a.batch) = a.attr["alpha"] * acc(a.n, a.m, a.batch) +
                                           a.attr["beta"] * a.c(a.n, a.m, a.batch);
                  return AccOut{acc, out};
                }),
    // PyTorch's linear, out = act(A W^T + bias), with W stored as it keeps it,
    // (out_features, in_features), and the bias as C broadcast along rows.
    // activation: 0 none, 1 ReLU (NaN stays NaN, as torch.relu keeps it).
    contraction(
        "linear", floats, "activation:i", true,
        [](const ContractionArgs& a) {
          Func acc = detail::product(a), out("out");
          Expr y = acc(a.n, a.m, a.batch) + a.c(a.n, a.m, a.batch);
          out(a.n, a.m, a.batch) =
              Halide::select(a.attr["activation"] == 1 && y < 0, Halide::cast(a.type, 0), y);
          return AccOut{acc, out};
        },
        BLayout::nk));

}  // namespace opforge::ops
