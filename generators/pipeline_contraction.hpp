// Contraction pipelines: batched matrix products.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

// The Func through which a kernel reads a B stored (n, k); hand schedules find it by this name.
inline constexpr const char* kBnkName = "b_nk";

// ---- contraction: a(k, m, b), b(n, k, b), c(n, m, b); call extents (N, M, K, batch) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::contraction) {
  const bool nk = op.b_layout == BLayout::nk;
  Pipeline p = start<T>(op, op.has_c ? 3 : 2, int(op.b_layout));
  Type t = halide_type<T>();
  ContractionArgs a;
  a.n = Var("n");
  a.m = Var("m");
  a.batch = Var("batch");
  // A may have any strides (a transposed view: a matmul's weight gradient reads the activations'
  // transpose), since schedules read it element by element; B and C are read in vectors along n,
  // or B along k where it is stored (n, k).
  auto A = detail::add_input(p, t, 3, "a", true);
  auto B = detail::add_input(p, t, 3, "b", false);
  a.a = Func(A);
  if (nk) {
    Var k("k");
    Func b_nk(kBnkName);
    b_nk(a.n, k, a.batch) = B(k, a.n, a.batch);
    a.b = b_nk;
  } else {
    a.b = Func(B);
  }
  if (op.has_c) a.c = Func(detail::add_input(p, t, 3, "c", true));
  a.r = Halide::RDom(0, A.dim(0).extent(), "r");
  a.type = t;
  a.attr = detail::make_attrs(p, op.attrs, t);
  AccOut ao = op.fn(a);
  p.acc = ao.acc;
  p.out = ao.out;
  p.vars = {a.n, a.m, a.batch};
  p.set_estimates = [p](int64_t size) mutable {
    p.inputs[0].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    p.inputs[1].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    if (p.inputs.size() > 2)
      p.inputs[2].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    p.out.set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    detail::estimate_attrs(p, 1);
    return std::vector<int64_t>{size, size, size, 1};
  };
  return p;
}

}  // namespace opforge::gen
