// Movement pipelines: strided copies and gathers.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

namespace detail {
// Row `index` of `n`, counted from the end when negative (the runtime has checked the range; the
// clamp keeps a schedule's overrun in bounds).
inline Expr row_of(const Expr& index, const Expr& n) {
  Expr idx = Halide::cast<int32_t>(index);
  return Halide::clamp(Halide::select(idx < 0, idx + n, idx), 0, n - 1);
}

// Gathers and index_add move rows, mostly of an embedding table: every (i, k, o) buffer is
// estimated at 256 rows of size/256 elements, the index at 256 entries.
inline std::vector<int64_t> estimate_rows(Pipeline& p, int64_t size) {
  int32_t rows = 256, inner = int32_t(std::max<int64_t>(size / rows, 1));
  const Halide::Region rows_3d = {{0, inner}, {0, rows}, {0, 1}};
  for (auto& in : p.inputs)
    in.set_estimates(in.dimensions() == 3 ? rows_3d : Halide::Region{{0, rows}});
  p.out.set_estimates(rows_3d);
  return {inner, rows, 1};
}
}  // namespace detail

// ---- movement: copy(in, 6-D, any strides), gather(in(i, k, o), index(j)) and
// index_add(dest(i, k, o), index(j), src(i, j, o)) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::movement) {
  Pipeline p = start<T>(op,
                        op.kind == MovementKind::copy        ? 1
                        : op.kind == MovementKind::index_add ? 3
                                                             : 2,
                        int(op.kind));
  Type t = halide_type<T>();
  p.out = Func("out");
  if (op.kind == MovementKind::copy) {
    for (int i = 0; i < detail::kEwDims; i++) p.vars.emplace_back("x" + std::to_string(i));
    auto in = detail::add_input(p, t, detail::kEwDims, "in", true);
    p.out(p.vars) = in(p.vars);
    p.out.output_buffer().dim(0).set_stride(Expr());
    p.set_estimates = [p](int64_t size) mutable { return detail::estimate_6d(p, size); };
  } else if (op.kind == MovementKind::index_add) {
    // dest(i, k, o) (any strides: a zero gradient is a broadcast 0), index(j), src(i, j, o). The
    // update's loop over j is serial; (i, o) are independent, so a schedule may run them in
    // parallel and in vectors without two lanes adding into one element.
    Var i("i"), k("k"), o("o");
    auto dest = detail::add_input(p, t, 3, "dest", true);
    auto index = detail::add_input(p, Halide::Int(64), 1, "index", true);
    auto src = detail::add_input(p, t, 3, "src", true);
    Expr n = dest.dim(1).extent();
    Halide::RDom r(0, src.dim(1).extent(), "r");
    // Read through boundary conditions: a schedule that runs the loop over r past its ends (an
    // autoscheduler's split) then adds zeros to a valid row rather than reading out of bounds.
    Func index_at = Halide::BoundaryConditions::repeat_edge(index);
    Func src_at = Halide::BoundaryConditions::constant_exterior(src, Halide::cast(t, 0));
    p.out(i, k, o) = dest(i, k, o);
    p.out(i, detail::row_of(index_at(r), n), o) += src_at(i, r, o);
    p.out.output_buffer().dim(0).set_stride(Expr());
    p.vars = {i, k, o};
    p.set_estimates = [p](int64_t size) mutable { return detail::estimate_rows(p, size); };
  } else {
    Var i("i"), j("j"), o("o");
    auto in = detail::add_input(p, t, 3, "in", true);
    auto index = detail::add_input(p, Halide::Int(64), 1, "index", true);
    p.out(i, j, o) = in(i, detail::row_of(index(j), in.dim(1).extent()), o);
    p.out.output_buffer().dim(0).set_stride(Expr());
    p.vars = {i, j, o};
    p.set_estimates = [p](int64_t size) mutable { return detail::estimate_rows(p, size); };
  }
  return p;
}

}  // namespace opforge::gen
