// What the hand schedules of every family share: on the CPU, vector widths and the size of a
// parallel task; on GPUs (OpenCL, CUDA), the ways to tile an output over blocks and threads, with
// reductions and accumulations serial inside each thread. Every GPU schedule guards its tails, so
// none has a minimum call size.
#pragma once
#include <string>
#include <vector>

#include "generators/pipeline.hpp"

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

// All pure dims fused into one and split over blocks of `threads` threads. A reduction that feeds
// another (var's mean) is computed once per thread, before the one it feeds.
inline void gpu_flat(gen::Pipeline& p, int threads) {
  std::vector<Halide::Var>& x = p.vars;
  Halide::Var f("f"), b("b"), t("t");
  if (x.size() == 1) {
    p.out.gpu_tile(x[0], b, t, threads, Halide::TailStrategy::GuardWithIf);
  } else {
    p.out.fuse(x[0], x[1], f);
    for (size_t d = 2; d < x.size(); d++) p.out.fuse(f, x[d], f);
    p.out.gpu_tile(f, b, t, threads, Halide::TailStrategy::GuardWithIf);
  }
  for (Halide::Func& r : p.reductions) r.compute_at(p.out, t);
}

// A normalize op's out(i, k, o): a block per row (i, o), its threads over k; the row's reductions
// (softmax's max and sum) are computed once per block, which the block's threads then share. Each
// thread reduces a strided part of the row (adjacent threads read adjacent elements), then one
// thread combines the block's partial results.
inline void gpu_rows(gen::Pipeline& p, int threads) {
  Halide::Var i = p.vars[0], k = p.vars[1], o = p.vars[2], row("row"), ko("ko"), ki("ki");
  p.out.reorder(k, i, o)
      .fuse(i, o, row)
      .split(k, ko, ki, threads, Halide::TailStrategy::GuardWithIf)
      .reorder(ki, ko, row)
      .gpu_blocks(row)
      .gpu_threads(ki);
  for (Halide::Func& r : p.reductions) {
    r.compute_at(p.out, row);
    if (r.outputs() != 1) continue;  // argmax-like: partial results would lose the first index
    Halide::RVar k_all = r.rvars(0)[0], ro("ro"), ri("ri");
    Halide::Var u("u");
    Halide::Func parts =
        r.update(0).split(k_all, ro, ri, threads, Halide::TailStrategy::GuardWithIf).rfactor(ri, u);
    parts.compute_at(p.out, row).gpu_threads(u).update(0).gpu_threads(u);
  }
}

// Two dims in 16x16 thread tiles, the remaining dims fused into the second block dimension.
inline void gpu_tile_2d(gen::Pipeline& p) {
  std::vector<Halide::Var>& x = p.vars;
  Halide::Var xo("xo"), yo("yo"), xi("xi"), yi("yi");
  p.out.tile(x[0], x[1], xo, yo, xi, yi, 16, 16, Halide::TailStrategy::GuardWithIf);
  for (size_t d = 2; d < x.size(); d++) p.out.fuse(yo, x[d], yo);
  p.out.gpu_blocks(xo, yo).gpu_threads(xi, yi);
  if (p.acc.defined()) p.acc.compute_at(p.out, xi);
  // What else accumulates (max_pool2d_backward's argmax per window): per thread too.
  for (Halide::Func& r : p.reductions) r.compute_at(p.out, xi);
}

}  // namespace opforge::schedules
