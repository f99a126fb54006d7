// Reduction pipelines over the canonical (inner, reduced, outer) view.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

// ---- reduction: in(i, k, o); call extents (inner, reduced, outer); a per_channel op's k is the
// kept channel axis ----
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
  a.count = in.dim(0).extent() * in.dim(2).extent();
  a.type = t;
  a.out_type = halide_type(p.out_dtype);
  a.attr = detail::make_attrs(p, op.attrs, t);
  p.out = Func("out");
  if (op.kind == ReductionKind::reduce) {
    p.vars = {a.i, a.o};
  } else if (op.kind == ReductionKind::per_channel) {
    p.vars = {a.k};
    a.across = Halide::RDom({{0, in.dim(0).extent()}, {0, in.dim(2).extent()}}, "across");
  } else {
    p.vars = {a.i, a.k, a.o};
  }
  auto result = op.fn(a);
  if constexpr (std::is_same_v<decltype(result), Halide::Tuple>) {
    std::vector<Expr> values;
    for (const Expr& e : result.as_vector()) values.push_back(Halide::cast(a.out_type, e));
    p.out(p.vars) = Halide::Tuple(values);
  } else {
    p.out(p.vars) = Halide::cast(a.out_type, result);
  }
  bool normalize = op.kind == ReductionKind::normalize;
  bool per_channel = op.kind == ReductionKind::per_channel;
  for (const auto& [name, f] : Halide::Internal::find_transitive_calls(p.out.function()))
    if (name != p.out.name() && f.has_update_definition()) p.reductions.emplace_back(f);
  p.set_estimates = [p, normalize, per_channel](int64_t size) mutable {
    // A per_channel op's autoscheduled variants need at least these extents: any plane
    // (layer_norm's view has none), and a quarter of the size in channels and batch (a CNN's 32
    // channels).
    std::vector<int64_t> ext = per_channel ? std::vector<int64_t>{1, size / 4, size / 4}
                                           : std::vector<int64_t>{1, size, size};
    p.inputs[0].set_estimates(detail::ranges(ext));
    for (size_t e = 1; e < p.inputs.size(); e++)
      p.inputs[e].set_estimates(p.inputs[e].dimensions() == 3 ? detail::ranges(ext)
                                                              : detail::ranges({ext[1]}));
    p.out.set_estimates(normalize     ? detail::ranges(ext)
                        : per_channel ? detail::ranges({ext[1]})
                                      : detail::ranges({1, size}));
    detail::estimate_attrs(p, 1);
    return ext;
  };
  return p;
}

}  // namespace opforge::gen
