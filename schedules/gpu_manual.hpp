// Hand-written GPU schedules (OpenCL, CUDA), one per family: the output is tiled over GPU blocks
// and threads; reductions and accumulations run serially inside each thread. Every schedule guards
// its tails, so none has a minimum call size.
#pragma once
#include <vector>

#include "generators/pipelines.hpp"

namespace opforge::schedules {

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
}

inline std::vector<int64_t> schedule_gpu(gen::Pipeline& p) {
  switch (p.family) {
    case dsl::Family::reduction:
      if (p.vars.size() == 3) {  // normalize: out keeps the reduced axis
        gpu_rows(p, 128);
        break;
      }
      gpu_flat(p, 128);
      break;
    case dsl::Family::elementwise:
    case dsl::Family::movement:
      gpu_flat(p, 128);
      break;
    case dsl::Family::contraction:
    case dsl::Family::window:
      gpu_tile_2d(p);
      break;
  }
  return {};
}

}  // namespace opforge::schedules
