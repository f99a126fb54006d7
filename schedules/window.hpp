// The hand schedules (CPU and GPU) of window ops: convolutions, pools and their gradients.
#pragma once
#include <optional>

#include "schedules/common.hpp"

namespace opforge::schedules {

// An accumulator's update as a register tile: `vec` in whole vectors of `v` lanes, unrolled with
// `other`, inside the reduction `r`, then the loops `rest`.
inline void register_tile(Stage s, const Var& vec, const Var& other, int v,
                          const std::vector<Halide::RVar>& r, const std::vector<Var>& rest) {
  Var whole(vec.name() + "_whole"), lane(vec.name() + "_lane");
  std::vector<Halide::VarOrRVar> order = {lane, whole, other};
  for (const auto& rv : r) order.emplace_back(rv);
  for (const auto& x : rest) order.emplace_back(x);
  s.split(vec, whole, lane, v).reorder(order).vectorize(lane).unroll(whole).unroll(other);
}

// conv2d_backward_weight's images in up to 16 chunks, each summed into a partial weight gradient
// of its own (fewer chunks where 16 partials would pass 2^22 values).
inline Expr images_per_chunk(const gen::Pipeline& p) {
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr images = p.inputs[1].dim(3).extent();  // conv2d_backward_weight's inputs: in, grad
  Expr weights = ob.dim(0).extent() * ob.dim(1).extent() * ob.dim(2).extent() * ob.dim(3).extent();
  Expr chunks = Halide::clamp((1 << 22) / Halide::max(weights, 1), 1, 16);
  return (images + chunks - 1) / chunks;
}

// conv2d_backward_weight along the gradient's rows (manual_small): per chunk of images (as the
// tiled schedule's, a task each), the sums in vectors along the rows (an rfactor over up to 8
// lanes: gradient rows are short), each vector of the gradient and of the input read in place,
// with no copy channels innermost. A register tile is 5 taps along a kernel row x 2 output
// channels (1 where their count is odd): each gradient vector serves 5 taps, each input vector 2
// channels. The first layer of the CNN (1 input channel): 3.3-5.3 -> 1.4-1.8 ms a call (two
// threads), the tiled schedule's copies having cost more than its sums.
inline std::vector<int64_t> manual_conv_grad_weight_rows(gen::Pipeline& p,
                                                         const Halide::Target& t) {
  const int v = std::min(vector_lanes(t, p.in_dtype), 8), taps = 5;
  auto r = p.acc.rvars(0);  // gradient x, gradient y, image
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr chunk = images_per_chunk(p);
  Halide::RVar rno("rno"), rni("rni"), rxo("rxo"), rxi("rxi");
  Var u("u"), lane("lane"), coo("coo"), coi("coi"), kxo("kxo"), kxi("kxi");
  Func part =
      p.acc.update(0).split(r[2], rno, rni, chunk, TailStrategy::GuardWithIf).rfactor(rno, u);
  Func lanes =
      part.update(0).split(r[0], rxo, rxi, v, TailStrategy::GuardWithIf).rfactor(rxi, lane);
  std::vector<Var> pa = part.args();   // kx, ky, ci, co, chunk
  std::vector<Var> la = lanes.args();  // kx, ky, ci, co, chunk, lane
  // The tile's taps and channels are rounded up in the partial sums' storage only (the input is
  // read through its zero border), so the tile's accumulators have a constant size: registers.
  auto tiles = [&](Stage s, int channels, std::optional<Halide::RVar> sum) {
    s.split(pa[3], coo, coi, channels, TailStrategy::RoundUp)
        .split(pa[0], kxo, kxi, taps, TailStrategy::RoundUp);
    std::vector<Halide::VarOrRVar> order;
    if (sum) order.emplace_back(*sum);
    for (const Var& x : {kxi, coi, kxo, pa[2], pa[1], coo, pa[4]}) order.emplace_back(x);
    s.reorder(order).parallel(pa[4]);
  };
  Expr even = ob.dim(3).extent() % 2 == 0;
  part.compute_root();
  tiles(part.specialize(even), 2, std::nullopt);
  tiles(part, 1, std::nullopt);
  tiles(part.update(0).specialize(even), 2, rxi);
  tiles(part.update(0), 1, rxi);
  lanes.compute_at(part, kxo)
      .reorder_storage(la[5], la[0], la[1], la[2], la[3], la[4])
      .vectorize(la[5]);
  // At unit stride and dilation the input's loads along a row are dense vectors.
  Expr unit = p.int_attr("stride_w") == 1 && p.int_attr("dil_w") == 1 && p.int_attr("groups") == 1;
  for (Stage s : {lanes.update(0).specialize(unit), lanes.update(0)})
    s.reorder({la[5], la[0], la[3], rxo, r[1], rni, la[2]})
        .vectorize(la[5])
        .unroll(la[0])
        .unroll(la[3]);
  p.acc.compute_root().update(0).parallel(p.vars[3]);
  std::vector<Var> pv = p.padded.args();
  p.padded.compute_root().parallel(pv[3]).vectorize(pv[0], v, TailStrategy::GuardWithIf);
  return {};
}

// conv2d_backward_weight: out(kx, ky, ci, co) sums, over every output position and image, the
// gradient there times the input under the tap. Two schedules:
// - tiled (manual): the images in up to 16 chunks, a partial weight gradient per chunk (an
//   rfactor; fewer chunks where 16 partials would pass 2^22 values), a task per chunk, the partials
//   summed at the end: a chunk's input and gradient stay in cache while every tap's tile passes
//   over them (a tile summing over all images streamed both from memory for each tile; chunks of 32
//   images ran the CNN's second layer 25% slower than chunks of 8). A register tile is two vectors
//   of output channels, read from an NHWC copy of the gradient, x 4 input channels, each a
//   broadcast from an NHWC copy of the input; with fewer than 4 input channels (a first layer's
//   one) x 3 rows of taps instead (a tap tile overlaps the last one where the kernel is not a
//   multiple of 3). Whole tiles: 2 vectors of output channels.
// - rows (manual_small, manual_conv_grad_weight_rows above): any size; made for few input
//   channels (a first layer's one), where the tiled one's copies of the input and gradient with
//   the channels innermost cost more than its sums.
inline std::vector<int64_t> manual_conv_grad_weight(gen::Pipeline& p, const Halide::Target& t,
                                                    bool small) {
  if (small) return manual_conv_grad_weight_rows(p, t);
  Var kx = p.vars[0], ky = p.vars[1], c = p.vars[2], n = p.vars[3];
  auto r = p.acc.rvars(0);                // gradient x, gradient y, image
  std::vector<Var> pv = p.padded.args();  // (x, y, channel, image)
  Expr dense_groups = p.int_attr("groups") == 1;
  int v = vector_lanes(t, p.in_dtype);
  const int tci = 4, tco = 2 * v, tky = 3;
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr chunk = images_per_chunk(p);
  Halide::RVar rno("rno"), rni("rni");
  Var u("u"), cio("cio"), cii("cii"), coo("coo"), coi("coi"), cv("cv");
  Func part =
      p.acc.update(0).split(r[2], rno, rni, chunk, TailStrategy::GuardWithIf).rfactor(rno, u);
  Func parts = part.in(p.acc);
  std::vector<Var> pa = part.args();  // kx, ky, ci, co, chunk
  parts.compute_root().reorder_storage(pa[3], pa[2], pa[0], pa[1], pa[4]);
  Expr wide = ob.dim(2).extent() >= tci;
  Var kyo("kyo"), kyi("kyi");
  auto tiles = [&](Stage f, int ci_tile, int ky_tile) {
    f.split(pa[3], coo, coi, tco)
        .split(coi, coi, cv, v)
        .split(pa[2], cio, cii, ci_tile)
        .split(pa[1], kyo, kyi, ky_tile)
        .reorder(cv, coi, cii, kyi, pa[0], kyo, cio, coo, pa[4])
        .vectorize(cv)
        .unroll(coi)
        .unroll(cii)
        .unroll(kyi)
        .parallel(pa[4]);
  };
  tiles(parts.specialize(wide), tci, 1);
  tiles(parts.specialize(ob.dim(1).extent() >= tky), 1, tky);
  tiles(Stage(parts), 1, 1);
  part.compute_at(parts, pa[0]).reorder_storage(pa[3], pa[2], pa[0], pa[1], pa[4]);
  part.split(pa[3], coi, cv, v)
      .reorder(cv, coi, pa[2], pa[1])
      .vectorize(cv)
      .unroll(coi)
      .unroll(pa[2])
      .unroll(pa[1]);
  auto tile = [&](Stage s) {
    s.split(pa[3], coi, cv, v)
        .reorder(cv, coi, pa[2], pa[0], pa[1], pa[4], r[0], r[1], rni)
        .vectorize(cv)
        .unroll(coi)
        .unroll(pa[2])
        .unroll(pa[1]);
  };
  tile(part.update(0).specialize(dense_groups));
  tile(part.update(0));
  // The partials summed stored output channels innermost, as the partials are: in vectors along
  // them (summed in the weight's own layout, each vector gathered from 16 chunks 3 MB apart, the
  // sum cost a fifth of the kernel); the weight gradient then copies that sum.
  p.out.parallel(n);
  p.acc.compute_root().reorder_storage(n, c, kx, ky).reorder(n, c, kx, ky);
  p.acc.vectorize(n, v, TailStrategy::GuardWithIf).parallel(ky);
  p.acc.update(0)
      .reorder(n, rno, c, kx, ky)
      .vectorize(n, v, TailStrategy::GuardWithIf)
      .parallel(ky);
  p.padded.compute_root()
      .reorder_storage(pv[2], pv[0], pv[1], pv[3])
      .reorder(pv[2], pv[0], pv[1], pv[3])
      .parallel(pv[3])
      .vectorize(pv[2], v, TailStrategy::GuardWithIf);
  Func grad_nhwc = p.inputs[1].in(part);
  std::vector<Var> gv = grad_nhwc.args();
  grad_nhwc.compute_root()
      .reorder_storage(gv[2], gv[0], gv[1], gv[3])
      .reorder(gv[2], gv[0], gv[1], gv[3])
      .parallel(gv[3])
      .vectorize(gv[2], v, TailStrategy::GuardWithIf);
  return {1, 1, 1, tco};
}

// conv2d_backward_input (manual): out(x, y, ci, n) sums gradient x weight over the taps that
// reach (x, y) and the output channels. The output point is outside the taps' loops, so those
// loops have exact bounds (a vector along x would visit the gradient's zero border: on a small
// image, half the taps). The vector runs along the input channels instead: a register tile of two
// vectors of channels x 4 images, each weight vector loaded once for the 4 images and each
// gradient value one broadcast, over a copy of the weight stored channels-innermost. The tile is
// transposed into the NCHW output a row at a time. Whole tiles: 2 vectors of channels, 4 images.
inline std::vector<int64_t> manual_conv_grad_input(gen::Pipeline& p, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype);
  const int tc = 2 * v, tn = 4;
  Var w = p.vars[0], h = p.vars[1], c = p.vars[2], n = p.vars[3];
  Var co("co"), ci("ci"), no("no"), ni("ni"), cv("cv"), task("task");
  auto r = p.acc.rvars(0);  // kernel x, kernel y, output channel
  p.out.split(c, co, ci, tc)
      .split(n, no, ni, tn)
      .reorder(w, ci, ni, h, co, no)
      .fuse(co, no, task)
      .parallel(task)
      .vectorize(w, v, TailStrategy::GuardWithIf);
  p.acc.compute_at(p.out, h).reorder_storage(c, n, w, h);
  p.acc.split(c, c, cv, v).reorder(cv, c, n, w, h).vectorize(cv).unroll(c).unroll(n);
  // At unit stride and dilation the taps' bounds are plain offsets of the output point.
  Expr unit = p.int_attr("stride_w") == 1 && p.int_attr("dil_w") == 1 &&
              p.int_attr("stride_h") == 1 && p.int_attr("dil_h") == 1 && p.int_attr("groups") == 1;
  for (Stage s : {p.acc.update(0).specialize(unit), p.acc.update(0)})
    register_tile(s, c, n, v, r, {w, h});
  Func wt = p.inputs[1].in(p.acc);  // conv2d_backward_input's inputs: grad, weight
  std::vector<Var> wv = wt.args();  // (kx, ky, ci, co)
  wt.compute_root()
      .reorder_storage(wv[2], wv[0], wv[1], wv[3])
      .reorder(wv[2], wv[0], wv[1], wv[3])
      .vectorize(wv[2], v, TailStrategy::GuardWithIf);
  return {1, 1, tc, tn};
}

inline std::vector<int64_t> manual_window(gen::Pipeline& p, const Halide::Target& t, bool small) {
  int v = vector_lanes(t, p.in_dtype);
  Var w = p.vars[0], h = p.vars[1], c = p.vars[2], n = p.vars[3];
  Var wo("wo"), wi("wi"), co("co"), ci("ci"), task("task");
  auto kind = dsl::WindowKind(p.variant_flags);
  if (kind == dsl::WindowKind::conv_grad_weight) return manual_conv_grad_weight(p, t, small);
  if (kind == dsl::WindowKind::conv_grad_input && !small) return manual_conv_grad_input(p, t);
  bool conv = kind == dsl::WindowKind::conv || kind == dsl::WindowKind::conv_grad_input;
  if (small || !conv) {
    // Image planes in groups of channels of one image, about 2^12 outputs a group (7 planes of a
    // 24 x 24 gradient, 28 of a 12 x 12 pool, 64 of an 8 x 8 one): what the output reads (the
    // image with its zero border) is computed per group, so it stays in the first-level cache and a
    // small plane does not pay a loop nest's set-up alone. A parallel task is several groups: one
    // small plane is less work than handing a task to a thread costs.
    Halide::OutputImageParam ob = p.out.output_buffers()[0];
    Expr plane = ob.dim(0).extent() * ob.dim(1).extent();
    Expr per_group = Halide::max(1, 4096 / Halide::max(plane, 1));
    Var group("group");
    p.out.split(c, co, ci, per_group, TailStrategy::GuardWithIf)
        .reorder(w, h, ci, co, n)
        .fuse(co, n, task)
        .split(task, task, group, iterations_per_task(plane * per_group), TailStrategy::GuardWithIf)
        .parallel(task);
    // The output overlaps its last vector with the one before (a whole vector where the row is
    // that wide, else half of one), or guards it where the row is narrower still: a predicated
    // tail costs more than the vector.
    // The pools' geometry is a run-time attribute: the common 2x2 pool of stride 2 gets branches
    // of its own, where the windows' positions are shifts rather than divisions and the loops
    // over taps and windows have constant extents.
    Expr two = conv ? Expr()
                    : p.int_attr("kernel_w") == 2 && p.int_attr("kernel_h") == 2 &&
                          p.int_attr("stride_w") == 2 && p.int_attr("stride_h") == 2 &&
                          p.int_attr("pad_w") == 0 && p.int_attr("pad_h") == 0;
    Expr ow = ob.dim(0).extent();
    auto widths = [&](std::optional<Expr> geometry) {
      auto when = [&](const Expr& wide) { return geometry ? *geometry && wide : wide; };
      p.out.specialize(when(ow >= v)).vectorize(w, v, TailStrategy::ShiftInwards);
      if (v >= 4)
        p.out.specialize(when(ow >= v / 2)).vectorize(w, v / 2, TailStrategy::ShiftInwards);
      if (geometry) p.out.specialize(*geometry).vectorize(w, v, TailStrategy::GuardWithIf);
    };
    if (!conv) widths(two);
    widths(std::nullopt);
    p.out.vectorize(w, v, TailStrategy::GuardWithIf);
    if (conv) return {};
    // The image with its zero border, once per group and rounded up to whole vectors: the taps
    // then load vectors rather than clamp each lane.
    if (p.padded.defined()) {  // (a gradient from saved indices reads no image)
      std::vector<Var> pv = p.padded.args();
      p.padded.compute_at(p.out, group).vectorize(pv[0], v, TailStrategy::RoundUp);
    }
    if (p.acc.has_update_definition()) {  // the 2x2 pool's taps unrolled
      Stage s = p.acc.update(0).specialize(two);
      for (const Halide::RVar& rv : p.acc.rvars(0)) s.unroll(rv);
    }
    return {};
  }
  // Register tile: `lanes` along w x 8 output channels; the reduction over (kx, ky, ci) runs
  // inside it. Whole tiles only (the last one overlaps the one before where the channels are not
  // a whole number of tiles). A whole vector where the output is that wide, else half of one:
  // the second layer of a small CNN is 8 wide, under AVX-512's 16 float lanes. Where the output
  // is 3 vectors wide (a first layer's 24 on AVX2), 3 vectors x 4 channels: each weight broadcast
  // then serves 3 multiply-adds rather than 1. Where it is one or two vectors wide and at least 4
  // rows high (a second layer's 8 x 8), a vector x 4 rows x 3 channels: 7 loads (4 rows of input,
  // 3 weight broadcasts) for 12 multiply-adds, where a vector x 8 channels needs 9 for 8 (a third
  // faster on the CNN's second layer; 2 rows x 6 channels spill AVX2's 16 registers). A parallel
  // task is a group of such tiles' rows, at least 2^15 outputs: a tile of a one-channel layer is
  // less work than handing it to a thread.
  const int tc = 8, half = std::max(v / 2, 1), wv = 3, wtc = 4, rtc = 3, rr = 4;
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Var rows("rows"), wa("wa"), wb("wb"), ho("ho"), hi("hi");
  auto tile = [&](Stage s, int lanes, int channels) {
    s.split(w, wo, wi, lanes)
        .split(c, co, ci, channels)
        .reorder(wi, ci, wo, h, co, n)
        .fuse(h, co, task)
        .fuse(task, n, task)
        .split(task, task, rows, iterations_per_task(ob.dim(0).extent() * channels),
               TailStrategy::GuardWithIf)
        .parallel(task)
        .split(wi, wa, wi, std::min(lanes, v))
        .vectorize(wi)
        .unroll(wa)
        .unroll(ci);
  };
  Expr wide = ob.dim(0).extent() >= v;        // a whole vector of outputs along w
  Expr wider = ob.dim(0).extent() >= wv * v;  // the variant's minimum is 8 channels
  Expr rows_tile = wide && ob.dim(1).extent() >= rr;
  tile(p.out.specialize(wider), wv * v, wtc);
  if (half < v) {
    p.out.specialize(rows_tile)
        .split(w, wo, wi, v)
        .split(c, co, ci, rtc)
        .split(h, ho, hi, rr)
        .reorder(wi, ci, hi, wo, ho, co, n)
        .fuse(ho, co, task)
        .fuse(task, n, task)
        .split(task, task, rows, iterations_per_task(ob.dim(0).extent() * rtc * rr),
               TailStrategy::GuardWithIf)
        .parallel(task)
        .vectorize(wi)
        .unroll(ci)
        .unroll(hi);
  }
  if (half < v) tile(p.out.specialize(wide), v, tc);
  tile(p.out, half, tc);
  auto r = p.acc.rvars(0);  // kernel x, kernel y, input channel
  // The accumulators are the tile: one full vector per output channel where the output is a vector
  // wide, else a half one (a narrower vector would halve every multiply-add's width).
  p.acc.compute_at(p.out, wo);
  auto acc_update = [&](Stage update, int lanes) {
    update.reorder(w, c, r[0], r[1], r[2], h, n).vectorize(w, lanes).unroll(c);
  };
  // Materialise the zero-padded image once, so the inner loads are plain vector loads rather than
  // per-lane clamped gathers.
  std::vector<Var> pv = p.padded.args();
  p.padded.compute_root().parallel(pv[3]).vectorize(pv[0], v, TailStrategy::GuardWithIf);
  // Stride and dilation are runtime attributes; at 1 (the common case) the input loads along w
  // are dense vectors instead of gathers and the input channel does not depend on the output
  // channel.
  Expr unit = p.int_attr("stride_w") == 1 && p.int_attr("dil_w") == 1 && p.int_attr("groups") == 1;
  p.acc.specialize(wider).split(w, wa, wb, v).vectorize(wb).unroll(wa).unroll(c);
  for (Stage s : {p.acc.update(0).specialize(wider && unit), p.acc.update(0).specialize(wider)})
    register_tile(s, w, c, v, r, {h, n});
  if (half < v) {
    p.acc.specialize(rows_tile).vectorize(w, v).unroll(c).unroll(h);
    for (Stage u :
         {p.acc.update(0).specialize(rows_tile && unit), p.acc.update(0).specialize(rows_tile)})
      u.reorder(w, c, h, r[0], r[1], r[2], n).vectorize(w, v).unroll(c).unroll(h);
  }
  if (half < v) {
    p.acc.specialize(wide).vectorize(w, v).unroll(c);
    acc_update(p.acc.update(0).specialize(wide && unit), v);
    acc_update(p.acc.update(0).specialize(wide), v);
  }
  p.acc.vectorize(w, half).unroll(c);
  acc_update(p.acc.update(0).specialize(unit), half);
  acc_update(p.acc.update(0), half);
  return {half, 1, tc, 1};
}

inline void gpu_window(gen::Pipeline& p) { gpu_tile_2d(p); }

}  // namespace opforge::schedules
