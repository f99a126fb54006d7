// The hand schedules (CPU and GPU) of contractions: register-tiled, packed and small on the CPU.
#pragma once
#include "schedules/common.hpp"

namespace opforge::schedules {

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

inline void gpu_contraction(gen::Pipeline& p) { gpu_tile_2d(p); }

}  // namespace opforge::schedules
