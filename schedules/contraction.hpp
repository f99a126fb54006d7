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
// dense vectors along k, so nothing is transposed. A register tile of 2 outputs along n x 4 along
// m keeps a vector of partial sums each (an rfactor over the vector's lanes, summed across once at
// the end: 8 accumulators and 6 loads fit AVX2's 16 registers); tiles run in blocks of up to
// 64 x 16 outputs, one task each, whose rows of A and B stay in the L2 cache. Whole tiles only
// (ShiftInwards), hence the minimum extents; blocks may be partial. Where A's rows are dense, and
// K a whole number of vectors (the common case), branches of their own load without gathers or
// lane guards.
inline std::vector<int64_t> manual_contraction_nk(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype);
  Var n = p.vars[0], m = p.vars[1], batch = p.vars[2];
  Halide::RVar r = p.acc.rvars(0)[0];
  const int tn = 2, tm = 4, bn = 64 / tn, bm = 16 / tm;  // blocks in tiles
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
  lanes.compute_at(p.out, no)
      .store_in(Halide::MemoryType::Register)
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
  // registers, not AVX-512's 32: 16 accumulators spill there), in 4-row-tile strips per task;
  // whole tiles only (ShiftInwards), hence the minimum extents.
  Var no("no"), mo("mo"), ni("ni"), mi("mi"), mii("mii"), tile("tile");
  const int tn = 2 * v, tm = t.has_feature(Halide::Target::AVX512) ? 8 : 6, strip = 4 * tm;
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
    // A B stored (n, k) is transposed by that copy.
    Func bp = nk ? b_nk_of(p) : p.inputs[1].in(p.acc);
    std::vector<Var> bv = bp.args();
    Expr n_ext = p.inputs[1].dim(nk ? 1 : 0).extent();
    bp.compute_root()
        .bound_storage(bv[0], (n_ext + 15) / 16 * 16 + 16)
        .parallel(bv[1])
        .vectorize(bv[0], v, TailStrategy::GuardWithIf);
  }
  return {tn, strip, 1, 1};
}

inline void gpu_contraction(gen::Pipeline& p) { gpu_tile_2d(p); }

}  // namespace opforge::schedules
