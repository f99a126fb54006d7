// Hand-written CPU schedules, one per family. Each returns the call extents below which it is
// invalid (empty: valid for every shape). Register-tiled schedules need whole tiles, so those
// families also get a "manual_small" variant without a minimum for the shapes below it.
#pragma once
#include <string>
#include <vector>

#include "generators/pipelines.hpp"

namespace opforge::schedules {
using Halide::Expr;
using Halide::Func;
using Halide::TailStrategy;
using Halide::Var;

inline int vector_lanes(const Halide::Target& t, DType d) {
  return t.natural_vector_size(dsl::halide_type(d));
}

inline void manual_elementwise(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, std::max(p.in_dtype, p.out_dtype) == DType::Bool
                              ? DType::Int32
                              : std::max(p.in_dtype, p.out_dtype));
  Func& out = p.out;
  auto& x = p.vars;
  Halide::OutputImageParam ob = out.output_buffer();
  Expr flat = Halide::Internal::const_true();
  for (size_t d = 1; d < x.size(); d++) flat = flat && ob.dim(int(d)).extent() == 1;
  Expr unit = Halide::Internal::const_true();
  for (auto& in : p.inputs) unit = unit && in.dim(0).stride() == 1;
  Var xo("xo"), xi("xi"), y("y");
  // Dense 1-D (the runtime collapses contiguous tensors to one dimension): big parallel chunks.
  out.specialize(flat && unit && ob.dim(0).extent() >= 16384)
      .split(x[0], xo, xi, 8192)
      .parallel(xo)
      .vectorize(xi, v);
  out.specialize(flat && unit && ob.dim(0).extent() >= v).vectorize(x[0], v);
  // Broadcast or strided views: parallel over the outer dimensions.
  out.fuse(x[1], x[2], y).fuse(y, x[3], y).fuse(y, x[4], y).fuse(y, x[5], y);
  out.specialize(ob.dim(0).extent() >= v).parallel(y).vectorize(x[0], v);
}

inline void manual_reduction(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype == DType::Bool ? DType::Int32 : p.in_dtype);
  Halide::OutputImageParam ob = p.out.output_buffer();
  Var i = p.vars.front(), o = p.vars.back();
  p.out.specialize(ob.dim(0).extent() >= v).parallel(o).vectorize(i, v);
  if (p.vars.size() == 3)  // normalize along contiguous rows (i extent 1): vectors along the row
    p.out.specialize(ob.dim(0).extent() == 1)
        .parallel(o)
        .vectorize(p.vars[1], v, TailStrategy::GuardWithIf);
  p.out.parallel(o);
  for (Func& f : p.row_reductions) {
    // Once per row, in v lanes of partial results (rfactor), then across the lanes.
    f.compute_at(p.out, o);
    Halide::RVar r = f.rvars(0)[0], ro("ro"), ri("ri");
    Var u("u");
    Func lanes = f.update(0).split(r, ro, ri, v, TailStrategy::GuardWithIf).rfactor(ri, u);
    lanes.compute_at(p.out, o).vectorize(u).update(0).vectorize(u);
  }
}

inline std::vector<int64_t> manual_contraction(gen::Pipeline& p, const Halide::Target& t,
                                               bool small, bool packed) {
  int v = vector_lanes(t, p.in_dtype);
  Var n = p.vars[0], m = p.vars[1], batch = p.vars[2];
  Halide::RVar r = p.acc.rvars(0)[0];
  if (small) {
    p.out.parallel(batch).vectorize(n, v, TailStrategy::GuardWithIf);
    return {};
  }
  // Register tile of 2 vectors x 8 rows of accumulators, in 4-row-tile strips per task; whole
  // tiles only (ShiftInwards), hence the minimum extents.
  Var no("no"), mo("mo"), ni("ni"), mi("mi"), mii("mii"), tile("tile");
  const int tn = 2 * v, tm = 8, strip = 4 * tm;
  p.out.tile(n, m, no, mo, ni, mi, tn, strip)
      .fuse(no, mo, tile)
      .fuse(tile, batch, tile)
      .parallel(tile)
      .split(mi, mi, mii, tm)
      .vectorize(ni, v)
      .unroll(ni)
      .unroll(mii);
  p.acc.compute_at(p.out, mi).vectorize(n, v).unroll(n).unroll(m);
  p.acc.update(0).reorder(n, m, r).vectorize(n, v).unroll(n).unroll(m);
  if (packed) {
    // Copy B once per call into rows padded off powers of two: a B panel whose rows lie 2^k floats
    // apart maps to a few cache sets and thrashes (measured at 2048: 0.47x OpenBLAS unpacked,
    // 0.67x packed). The copy costs more than it saves on small products, so both variants exist.
    Func bp = p.inputs[1].in(p.acc);
    std::vector<Var> bv = bp.args();
    Expr n_ext = p.inputs[1].dim(0).extent();
    bp.compute_root()
        .bound_storage(bv[0], (n_ext + 15) / 16 * 16 + 16)
        .parallel(bv[1])
        .vectorize(bv[0], v, TailStrategy::GuardWithIf);
  }
  return {tn, strip, 1, 1};
}

inline std::vector<int64_t> manual_window(gen::Pipeline& p, const Halide::Target& t, bool small) {
  int v = vector_lanes(t, p.in_dtype);
  Var w = p.vars[0], h = p.vars[1], c = p.vars[2], n = p.vars[3];
  Var wo("wo"), wi("wi"), co("co"), ci("ci"), task("task");
  bool conv = p.variant_flags == int(dsl::WindowKind::conv);
  if (small || !conv) {
    p.out.fuse(c, n, task).parallel(task).vectorize(w, v, TailStrategy::GuardWithIf);
    return {};
  }
  // Register tile: one vector along w x 8 output channels; the reduction over (kx, ky, ci)
  // runs inside it. Whole tiles only.
  const int tc = 8;
  p.out.split(w, wo, wi, v)
      .split(c, co, ci, tc)
      .reorder(wi, ci, wo, h, co, n)
      .fuse(h, co, task)
      .fuse(task, n, task)
      .parallel(task)
      .vectorize(wi)
      .unroll(ci);
  auto r = p.acc.rvars(0);  // kernel x, kernel y, input channel
  p.acc.compute_at(p.out, wo).vectorize(w).unroll(c);
  p.acc.update(0).reorder(w, c, r[0], r[1], r[2], h, n).vectorize(w).unroll(c);
  // Materialise the zero-padded input once, so the inner loads are plain vector loads rather than
  // per-lane clamped gathers.
  std::vector<Var> pv = p.padded.args();
  p.padded.compute_root().parallel(pv[3]).vectorize(pv[0], v, TailStrategy::GuardWithIf);
  // Stride and dilation are runtime attributes; at 1 (the common case) the input loads along w
  // are dense vectors instead of gathers and the input channel does not depend on the output
  // channel.
  p.acc.update(0).specialize(p.int_attr("stride_w") == 1 && p.int_attr("dil_w") == 1 &&
                             p.int_attr("groups") == 1);
  return {v, 1, tc, 1};
}

inline void manual_movement(gen::Pipeline& p, const Halide::Target& t) {
  if (p.variant_flags == int(dsl::MovementKind::copy)) {
    manual_elementwise(p, t);
    return;
  }
  int v = vector_lanes(t, p.in_dtype == DType::Bool ? DType::Int32 : p.in_dtype);
  Halide::OutputImageParam ob = p.out.output_buffer();
  p.out.specialize(ob.dim(0).extent() >= v).parallel(p.vars[2]).vectorize(p.vars[0], v);
  p.out.parallel(p.vars[2]);
}

inline std::vector<int64_t> schedule_manual(gen::Pipeline& p, const Halide::Target& t,
                                            const std::string& variant) {
  bool small = variant == "manual_small", packed = variant == "manual_packed";
  switch (p.family) {
    case dsl::Family::elementwise:
      manual_elementwise(p, t);
      break;
    case dsl::Family::reduction:
      manual_reduction(p, t);
      break;
    case dsl::Family::contraction:
      return manual_contraction(p, t, small, packed);
    case dsl::Family::window:
      return manual_window(p, t, small);
    case dsl::Family::movement:
      manual_movement(p, t);
      break;
  }
  return {};
}

}  // namespace opforge::schedules
