// The hand schedules (CPU and GPU) of elementwise kernels and of their dense companions.
#pragma once
#include "schedules/common.hpp"

namespace opforge::schedules {

// An op that updates several of its inputs in place (an optimiser step: a parameter and its
// moments) stores a Tuple of results over them. Halide stores a Tuple's values one after another
// and computes each from its own loads, so a later value would reload an input that an earlier
// store already overwrote (the buffers alias; Halide and LLVM take them as distinct). Such an op
// reads its inputs through `p.staged`, which these schedules compute per vector, ahead of the
// stores: rows (the strided kernel's outer dims) and chunks of 8192 in parallel, vectors inside.
inline void manual_updates(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, std::max(p.in_dtype, p.out_dtype));
  auto& x = p.vars;
  Var xc("xc"), xr("xr"), xo("xo"), xi("xi"), task("task");
  p.out.split(x[0], xc, xr, 8192, TailStrategy::GuardWithIf);
  Var outer = xc;
  for (size_t d = 1; d < x.size(); d++) {
    p.out.fuse(outer, x[d], task);
    outer = task;
  }
  p.out.parallel(outer).split(xr, xo, xi, v, TailStrategy::GuardWithIf).vectorize(xi);
  // One vector's worth (one element of every outer dimension), in registers: a size known when
  // compiled (the tail's is smaller).
  std::vector<Var> sv = p.staged.args();
  p.staged.compute_at(p.out, xo).store_in(Halide::MemoryType::Register);
  p.staged.bound_storage(sv[0], v);
  for (size_t d = 1; d < sv.size(); d++) p.staged.bound_extent(sv[d], 1);
  p.staged.vectorize(sv[0], v, TailStrategy::GuardWithIf);
}

inline void manual_elementwise(gen::Pipeline& p, const Halide::Target& t) {
  if (p.staged.defined()) return manual_updates(p, t);
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
  if (p.staged.defined()) return manual_updates(p, t);
  int v = vector_lanes(t, std::max(p.in_dtype, p.out_dtype));
  Func& out = p.out;
  Var x = p.vars[0], xo("xo"), xi("xi");
  Halide::OutputImageParam ob = out.output_buffers()[0];
  out.specialize(ob.dim(0).extent() >= 16384).split(x, xo, xi, 8192).parallel(xo).vectorize(xi, v);
  out.specialize(ob.dim(0).extent() >= v).vectorize(x, v);
}

// Updates in place on a GPU (manual_updates' ops): each thread computes `p.staged` at its one
// element before it stores. The output's dims are not fused into one, as gpu_flat does: Halide
// bounds what a fused loop's inner dim needs by the whole dim, so each thread's staged values
// would be sized by the tensor (a device buffer of the elements times the threads, too large
// to allocate from 32 768 elements on, and a host loop over every thread to size it). The dims
// past the first run inside each thread; the runtime collapses a contiguous tensor, as an
// optimiser's parameters and state are, into the first.
inline void gpu_updates(gen::Pipeline& p) {
  std::vector<Var>& x = p.vars;
  Var b("b"), t("t");
  p.out.gpu_tile(x[0], b, t, 128, TailStrategy::GuardWithIf);
  if (x.size() == 1) {
    p.staged.compute_at(p.out, t);
    return;
  }
  std::vector<Halide::VarOrRVar> order(x.begin() + 1, x.end());  // innermost first
  order.push_back(t);
  order.push_back(b);
  p.out.reorder(order);
  p.staged.compute_at(p.out, x[1]);
}

inline void gpu_elementwise(gen::Pipeline& p) {
  if (p.staged.defined()) return gpu_updates(p);
  gpu_flat(p, 128);
}

}  // namespace opforge::schedules
