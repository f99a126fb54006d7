// The hand schedules (CPU and GPU) of contractions: register-tiled, packed and small on the CPU;
// dot products of rows where B is stored (n, k).
#pragma once
#include "generators/pipeline_contraction.hpp"
#include "schedules/common.hpp"

namespace opforge::schedules {

// The Func that reads a B stored (n, k) (generators/pipeline_contraction.hpp).
inline Func b_nk_of(const gen::Pipeline& p) {
  const std::string prefix = std::string(gen::kBnkName) + "$";  // Halide makes names unique
  for (const auto& [name, f] : Halide::Internal::find_transitive_calls(p.out.function()))
    if (name == gen::kBnkName || name.rfind(prefix, 0) == 0) return Func(f);
  throw std::runtime_error(p.op + ": B is stored (n, k) but no " + gen::kBnkName + " reads it");
}

// B stored (n, k), a linear layer's weight: each output is a dot product of two rows, both read in
// dense vectors along k, so nothing is transposed. A register tile of 3 outputs along n x 4 along
// m keeps a vector of partial sums each (an rfactor over the vector's lanes, summed across once at
// the end): 12 accumulators hide the FMA latency behind 7 loads, and with the 3 rows of B in
// registers AVX2's 16 are full (2 x 4 was load-bound: 6 loads for 8 FMAs, 10-15% slower at the
// MLP's shapes). Tiles run in blocks of up to 48 x 16 outputs, one task each, whose rows of A and B
// stay in the L2 cache. Whole tiles only (ShiftInwards), hence the minimum extents; blocks may be
// partial. Where A's rows are dense, and K a whole number of vectors (the common case), branches of
// their own load without gathers or lane guards.
inline std::vector<int64_t> manual_contraction_nk(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype);
  Var n = p.vars[0], m = p.vars[1], batch = p.vars[2];
  Halide::RVar r = p.acc.rvars(0)[0];
  const int tn = 3, tm = 4, bn = 48 / tn, bm = 16 / tm;  // blocks in tiles
  Var nb("nb"), mb("mb"), no("no"), mo("mo"), ni("ni"), mi("mi"), block("block"), u("u");
  p.out.split(n, no, ni, tn)
      .split(m, mo, mi, tm)
      .split(no, nb, no, bn, TailStrategy::GuardWithIf)
      .split(mo, mb, mo, bm, TailStrategy::GuardWithIf)
      .reorder(ni, mi, no, mo, nb, mb, batch)
      .fuse(nb, mb, block)
      .fuse(block, batch, block)
      .parallel(block)
      .unroll(ni)
      .unroll(mi);
  Halide::RVar ro("ro"), ri("ri");
  p.acc.compute_at(p.out, no).unroll(n).unroll(m);
  Func lanes = p.acc.update(0).split(r, ro, ri, v).rfactor(ri, u);
  p.acc.update(0).unroll(n).unroll(m);
  // Each output's lanes side by side: with the lanes outermost, every partial-sum vector was
  // stored at a stride of 12 and the final sums read one lane at a time (157 against 122 GFLOP/s
  // at 128 x 784 x 512).
  lanes.compute_at(p.out, no)
      .store_in(Halide::MemoryType::Register)
      .reorder_storage(u, n, m)
      .bound_extent(u, v)
      .vectorize(u)
      .unroll(n)
      .unroll(m);
  lanes.update(0).reorder(u, n, m, ro).vectorize(u).unroll(n).unroll(m);
  // A may have any strides; its rows are dense vectors only where they are stated to be.
  const Halide::ImageParam& a = p.inputs[0];
  p.out.specialize(a.dim(0).stride() == 1 && a.dim(0).extent() % v == 0);
  p.out.specialize(a.dim(0).stride() == 1);
  return {tn, tm, 1, 1};
}

inline std::vector<int64_t> manual_contraction(gen::Pipeline& p, const Halide::Target& t,
                                               bool small, bool packed) {
  int v = vector_lanes(t, p.in_dtype);
  Var n = p.vars[0], m = p.vars[1], batch = p.vars[2];
  Halide::RVar r = p.acc.rvars(0)[0];
  const bool nk = p.variant_flags == int(dsl::BLayout::nk);
  if (nk && !small && !packed) return manual_contraction_nk(p, t);
  if (small) {
    p.out.parallel(batch).vectorize(n, v, TailStrategy::GuardWithIf);
    return {};
  }
  // Register tile of 2 vectors x 8 rows of accumulators (6 rows where there are 16 vector
  // registers, not AVX-512's 32: 16 accumulators spill there), in strips of up to 32 tiles along
  // m per task. Whole tiles only (ShiftInwards), hence the minimum extents; a strip may be partial,
  // so a tail repeats at most one tile's rows (a whole shifted strip of 4 tiles repeated 16 of a
  // batch of 128's rows: 8-13% slower at the MLP's shapes).
  Var no("no"), mo("mo"), ni("ni"), mi("mi"), mb("mb"), tile("tile");
  const int tn = 2 * v, tm = t.has_feature(Halide::Target::AVX512) ? 8 : 6, strip = 32;
  p.out.split(n, no, ni, tn)
      .split(m, mo, mi, tm)
      .split(mo, mb, mo, strip, TailStrategy::GuardWithIf)
      .reorder(ni, mi, mo, no, mb, batch)
      .fuse(no, mb, tile)
      .fuse(tile, batch, tile)
      .parallel(tile)
      .vectorize(ni, v)
      .unroll(ni)
      .unroll(mi);
  p.acc.compute_at(p.out, mo).vectorize(n, v).unroll(n).unroll(m);
  p.acc.update(0).reorder(n, m, r).vectorize(n, v).unroll(n).unroll(m);
  if (!packed) {
    // Each task copies its panel of B (all of K by the tile's 2 vectors) into a dense buffer that
    // its strip's tiles then read in order. B's rows read in place lie N floats apart, often a
    // power of two that maps them to a few cache sets (at 128 x 256 x 512: 284 -> 209 us; at
    // 128 x 784 x 512: 869 -> 626 us).
    Func bp = p.inputs[1].in(p.acc);
    bp.compute_at(p.out, tile).vectorize(bp.args()[0], v).unroll(bp.args()[0]);
  } else {
    // Copy B once per call into rows padded off powers of two: a B panel whose rows lie 2^k floats
    // apart maps to a few cache sets and thrashes (measured at 2048: 0.47x OpenBLAS unpacked,
    // 0.67x packed). The copy costs more than it saves on small products, so both variants exist.
    // A B stored (n, k) is transposed by that copy.
    Func bp = nk ? b_nk_of(p) : p.inputs[1].in(p.acc);
    std::vector<Var> bv = bp.args();
    Expr n_ext = p.inputs[1].dim(nk ? 1 : 0).extent();
    bp.compute_root()
        .bound_storage(bv[0], (n_ext + 15) / 16 * 16 + 16)
        .parallel(bv[1])
        .vectorize(bv[0], v, TailStrategy::GuardWithIf);
  }
  return {tn, tm, 1, 1};
}

inline void gpu_contraction(gen::Pipeline& p) { gpu_tile_2d(p); }

}  // namespace opforge::schedules
