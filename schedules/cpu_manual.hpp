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
using Halide::Stage;
using Halide::TailStrategy;
using Halide::Var;

// Bool is computed as 32-bit lanes.
inline int vector_lanes(const Halide::Target& t, DType d) {
  return t.natural_vector_size(dsl::halide_type(d == DType::Bool ? DType::Int32 : d));
}

// How many iterations of a parallel loop make one task of at least 2^15 elements: Halide's thread
// pool hands each task off under a lock, which costs more than a short task gains (reduction rows
// of 4096 as separate tasks ran no faster on two cores than on one).
inline Expr iterations_per_task(const Expr& elements_per_iteration) {
  return Halide::max(1, (1 << 15) / Halide::max(elements_per_iteration, 1));
}

inline void manual_elementwise(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, std::max(p.in_dtype, p.out_dtype));
  Func& out = p.out;
  auto& x = p.vars;
  Halide::OutputImageParam ob = out.output_buffers()[0];
  Expr flat = Halide::Internal::const_true();
  for (size_t d = 1; d < x.size(); d++) flat = flat && ob.dim(int(d)).extent() == 1;
  Expr unit = Halide::Internal::const_true(), strided = Halide::Internal::const_false();
  for (auto& in : p.inputs) {
    unit = unit && in.dim(0).stride() == 1;
    strided = strided || (in.dim(0).stride() != 0 && in.dim(0).stride() != 1);
  }
  Var xo("xo"), xi("xi"), y("y"), yo("yo"), yi("yi"), yt("yt"), tile("tile");
  // Dense 1-D (the runtime collapses contiguous tensors to one dimension): big parallel chunks.
  out.specialize(flat && unit && ob.dim(0).extent() >= 16384)
      .split(x[0], xo, xi, 8192)
      .parallel(xo)
      .vectorize(xi, v);
  out.specialize(flat && unit && ob.dim(0).extent() >= v).vectorize(x[0], v);
  out.specialize(flat && unit);  // under a vector: one plain loop, no hand-off to the thread pool
  // An input strided along the innermost dimension (a transpose): 64 x 64 tiles, so the lines
  // and pages a tile's strided loads touch serve the whole tile.
  Stage tiled = out.specialize(strided && ob.dim(0).extent() >= 64 && ob.dim(1).extent() >= 64)
                    .tile(x[0], x[1], xo, yo, xi, yi, 64, 64)
                    .fuse(xo, yo, tile);
  for (size_t d = 2; d < x.size(); d++) tiled.fuse(tile, x[d], tile);
  tiled.parallel(tile).vectorize(xi, v);
  // Broadcasts and the rest: rows of the fused outer dimensions, grouped into tasks. The strides
  // are stated where they are known (unit strides: a bias along rows; one input broadcast along
  // the row: a bias along columns), so those loads are vectors rather than per-lane gathers; the
  // schedule is the same in each branch.
  out.fuse(x[1], x[2], y).fuse(y, x[3], y).fuse(y, x[4], y).fuse(y, x[5], y);
  out.split(y, yt, y, iterations_per_task(ob.dim(0).extent()), TailStrategy::GuardWithIf)
      .parallel(yt);
  Expr vectors = ob.dim(0).extent() >= v;
  out.specialize(unit && vectors).vectorize(x[0], v);
  for (size_t k = 0; p.inputs.size() > 1 && k < p.inputs.size(); k++) {
    Expr one_broadcast = p.inputs[k].dim(0).stride() == 0;
    for (size_t j = 0; j < p.inputs.size(); j++)
      if (j != k) one_broadcast = one_broadcast && p.inputs[j].dim(0).stride() == 1;
    out.specialize(one_broadcast && vectors).vectorize(x[0], v);
  }
  out.specialize(vectors).vectorize(x[0], v);
}

// The dense companion of an elementwise kernel (one contiguous dimension): the strided kernel's
// dense branches without its checks of six dimensions' strides, which cost more than adding a
// few elements does.
inline void manual_dense(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, std::max(p.in_dtype, p.out_dtype));
  Func& out = p.out;
  Var x = p.vars[0], xo("xo"), xi("xi");
  Halide::OutputImageParam ob = out.output_buffers()[0];
  out.specialize(ob.dim(0).extent() >= 16384).split(x, xo, xi, 8192).parallel(xo).vectorize(xi, v);
  out.specialize(ob.dim(0).extent() >= v).vectorize(x, v);
}

// A reduction stage's loop over r in `lanes` independent vector lanes (rfactor), computed at
// `at`, then combined across the lanes. rfactor appends the lanes' index to the intermediate's
// dimensions; it is stored innermost, so the lanes are one dense vector.
inline void in_vector_lanes(Stage stage, const Halide::RVar& r, int lanes,
                            const Halide::LoopLevel& at) {
  Halide::RVar ro("ro"), ri("ri");
  Var u("u");
  Func partial = stage.split(r, ro, ri, lanes, TailStrategy::GuardWithIf).rfactor(ri, u);
  std::vector<Var> order{u};
  for (const Var& a : partial.args())
    if (a.name() != u.name()) order.push_back(a);
  partial.reorder_storage(order).compute_at(at).vectorize(u).update(0).vectorize(u);
}

// A reduction's layout is known only at the call, so each branch is a specialization:
// - rows: the reduced axis is contiguous and nothing lies inside it (the runtime's canonical view
//   of a reduction over the last axes): a row's reductions accumulate in vector lanes (rfactor)
//   that are combined at the end; a reduction over most of a tensor also splits its rows into
//   chunks that run in parallel.
// - columns: a vector or more inside the reduced axis: vectors along it, blocks of them in
//   parallel; the reduced loop runs outside the vectors of a block, so each step reads whole
//   cache lines.
// Either way the reductions are computed once per outer index (and block), before the output
// reads them, and a parallel task holds enough work to pay for its hand-off.
inline void manual_reduction(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype);
  const bool normalize = p.vars.size() == 3;
  // Vectors per parallel task along the inner axis: a task reads 4 KiB or more of each row it
  // touches (narrower strips cost a page walk per few cache lines).
  const int block = 64;
  // Independent accumulators: one vector's running sum would wait on each add's latency.
  const int lanes_per_row = 4 * v;
  Func& out = p.out;
  Halide::OutputImageParam ob = out.output_buffers()[0];
  const Halide::ImageParam& in = p.inputs[0];
  Var i = p.vars.front(), o = p.vars.back(), iv("iv"), ii("ii"), ib("ib");
  // (Unit strides stated, or every load and store is a per-lane gather or scatter.)
  Expr rows = ob.dim(0).extent() == 1 && in.dim(1).stride() == 1;
  if (normalize) rows = rows && ob.dim(1).stride() == 1;
  Expr cols = ob.dim(0).extent() >= v && in.dim(0).stride() == 1;
  // Too few rows to occupy the cores, each long enough to be worth splitting.
  const int chunk = 1 << 16;
  Expr chunked = rows && ob.dim(1).extent() < 8 && in.dim(1).extent() >= 2 * chunk;

  Var ot("ot");
  Stage rows_out =
      out.specialize(rows)
          .split(o, ot, o, iterations_per_task(in.dim(1).extent()), TailStrategy::GuardWithIf)
          .parallel(ot);
  if (normalize) rows_out.vectorize(p.vars[1], v, TailStrategy::GuardWithIf);
  // A task: a block of vectors along i over a group of outer indices (the reductions computed
  // for the block at each of them).
  Var task("task");
  Stage cols_out =
      out.specialize(cols)
          .split(i, iv, ii, v)
          .split(iv, ib, iv, block, TailStrategy::GuardWithIf)
          .split(o, ot, o, iterations_per_task(in.dim(0).extent() * in.dim(1).extent()),
                 TailStrategy::GuardWithIf)
          .vectorize(ii);
  if (normalize)
    cols_out.reorder(ii, iv, p.vars[1], o, ib, ot);
  else
    cols_out.reorder(ii, iv, o, ib, ot);
  cols_out.fuse(ib, ot, task).parallel(task);
  out.parallel(o);

  for (Func& f : p.reductions) {
    f.compute_at(out, o);
    Var fi;
    for (const Var& a : f.args())
      if (a.name() == i.name()) fi = a;
    Halide::RVar r = f.rvars(0)[0], rc("rc"), rr("rr");
    Var c("c"), fv("fv"), fii("fii");
    // argmax and argmin keep the first index of equal values; lanes would reorder them.
    const bool lanes_ok = f.outputs() == 1;
    if (lanes_ok && !normalize) {
      Func parts = f.update(0)
                       .specialize(chunked)
                       .split(r, rc, rr, chunk, TailStrategy::GuardWithIf)
                       .rfactor(rc, c);
      parts.compute_at(out, o).update(0).parallel(c);
      in_vector_lanes(parts.update(0), rr, lanes_per_row, Halide::LoopLevel(parts, c));
    }
    if (lanes_ok)
      in_vector_lanes(f.update(0).specialize(rows), r, lanes_per_row, Halide::LoopLevel(out, o));
    f.specialize(cols).vectorize(fi, v, TailStrategy::GuardWithIf);
    f.update(0)
        .specialize(cols)
        .split(fi, fv, fii, v, TailStrategy::GuardWithIf)
        .reorder(fii, fv, r)
        .vectorize(fii);
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
  int v = vector_lanes(t, p.in_dtype);
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
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
