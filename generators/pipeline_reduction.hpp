// Reduction pipelines over the canonical (inner, reduced, outer) view.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

// ---- reduction: in(i, k, o); call extents (inner, reduced, outer); a per_channel or
// channel_normalize op's k is the kept channel axis ----
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
  auto cast_all = [&](const Halide::Tuple& t) {
    std::vector<Expr> values;
    for (const Expr& e : t.as_vector()) values.push_back(Halide::cast(a.out_type, e));
    return Halide::Tuple(values);
  };
  if (op.kind == ReductionKind::reduce) {
    p.vars = {a.i, a.o};
  } else if (op.kind == ReductionKind::normalize) {
    p.vars = {a.i, a.k, a.o};
  } else {
    a.across = Halide::RDom({{0, in.dim(0).extent()}, {0, in.dim(2).extent()}}, "across");
    p.vars = {a.k};
  }
  if constexpr (!std::is_same_v<decltype(op.channel_fn), std::nullptr_t>) {
    p.side = Func("channel");
    p.side(a.k) = cast_all(op.channel_fn(a));
    a.channel = p.side;
    p.vars = {a.i, a.k, a.o};
  }
  auto result = op.fn(a);
  if constexpr (std::is_same_v<decltype(result), Halide::Tuple>)
    p.out(p.vars) = cast_all(result);
  else
    p.out(p.vars) = Halide::cast(a.out_type, result);
  bool normalize = op.kind == ReductionKind::normalize;
  bool per_channel = op.kind == ReductionKind::per_channel;
  bool channel_normalize = op.kind == ReductionKind::channel_normalize;
  for (const Func& o : p.outputs())
    for (const auto& [name, f] : Halide::Internal::find_transitive_calls(o.function()))
      if (name != o.name() && f.has_update_definition() &&
          std::none_of(p.reductions.begin(), p.reductions.end(),
                       [&](const Func& r) { return r.name() == name; }))
        p.reductions.emplace_back(f);
  const bool row_view = op.row_view;
  p.set_estimates = [p, normalize, per_channel, channel_normalize, row_view](int64_t size) mutable {
    // A per_channel op's autoscheduled variants need at least these extents: any plane
    // (layer_norm_backward_reduce's view has none), and a quarter of the size in channels and
    // batch (a CNN's 32 channels); a row_normalize op's, a quarter of the size in the rows and
    // their elements, whose view has no batch.
    std::vector<int64_t> ext = row_view ? std::vector<int64_t>{size / 4, size / 4, 1}
                               : per_channel || channel_normalize
                                   ? std::vector<int64_t>{1, size / 4, size / 4}
                                   : std::vector<int64_t>{1, size, size};
    p.inputs[0].set_estimates(detail::ranges(ext));
    for (size_t e = 1; e < p.inputs.size(); e++)
      p.inputs[e].set_estimates(p.inputs[e].dimensions() == 3 ? detail::ranges(ext)
                                                              : detail::ranges({ext[1]}));
    p.out.set_estimates(normalize || channel_normalize ? detail::ranges(ext)
                        : per_channel                  ? detail::ranges({ext[1]})
                                                       : detail::ranges({1, size}));
    if (p.side.defined()) p.side.set_estimates(detail::ranges({ext[1]}));
    detail::estimate_attrs(p, 1);
    return ext;
  };
  return p;
}

}  // namespace opforge::gen
