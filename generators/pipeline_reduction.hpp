// Reduction pipelines over the canonical (inner, reduced, outer) view.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

// ---- reduction: in(i, k, o); call extents (inner, reduced, outer) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::reduction) {
  Pipeline p = start<T>(op, 1 + op.like_inputs + op.extra_inputs, int(op.kind));
  Type t = halide_type<T>();
  RedArgs a;
  a.i = Var("i");
  a.k = Var("k");
  a.o = Var("o");
  auto in = detail::add_input(p, t, 3, "in", true);
  a.in = Func(in);
  for (int j = 0; j < op.like_inputs; j++)
    a.like.push_back(Func(detail::add_input(p, t, 3, "like" + std::to_string(j), true)));
  for (int e = 0; e < op.extra_inputs; e++)
    a.extra.push_back(Func(detail::add_input(p, t, 1, "extra" + std::to_string(e), false)));
  a.n = in.dim(1).extent();
  a.r = Halide::RDom(0, a.n, "r");
  a.type = t;
  a.out_type = halide_type(p.out_dtype);
  a.attr = detail::make_attrs(p, op.attrs, t);
  p.out = Func("out");
  if (op.kind == ReductionKind::reduce) {
    p.vars = {a.i, a.o};
  } else {
    p.vars = {a.i, a.k, a.o};
  }
  p.out(p.vars) = Halide::cast(a.out_type, op.fn(a));
  bool normalize = op.kind == ReductionKind::normalize;
  for (const auto& [name, f] : Halide::Internal::find_transitive_calls(p.out.function()))
    if (name != p.out.name() && f.has_update_definition()) p.reductions.emplace_back(f);
  p.set_estimates = [p, normalize](int64_t size) mutable {
    std::vector<int64_t> ext = {1, size, size};
    p.inputs[0].set_estimates(detail::ranges(ext));
    for (size_t e = 1; e < p.inputs.size(); e++)
      p.inputs[e].set_estimates(p.inputs[e].dimensions() == 3 ? detail::ranges(ext)
                                                              : Halide::Region{{0, int32_t(size)}});
    p.out.set_estimates(normalize ? detail::ranges(ext) : detail::ranges({1, size}));
    detail::estimate_attrs(p, 1);
    return ext;
  };
  return p;
}

}  // namespace opforge::gen
