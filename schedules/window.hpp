// The hand schedules (CPU and GPU) of window ops: convolutions, pools and their gradients.
#pragma once
#include "schedules/common.hpp"

namespace opforge::schedules {

// conv2d_backward_weight: out(kx, ky, ci, co) sums, over every output position and image, the
// gradient there times the input under the tap. Two schedules:
// - tiled (manual): the product it is. A register tile of one vector of input channels x 8 output
//   channels accumulates over every position and image, the input read from a copy stored
//   channels-innermost (NHWC), so a vector of channels is one load and each gradient value one
//   broadcast; with fewer input channels than a vector, a vector of output channels over an NHWC
//   copy of the gradient instead. Whole tiles: a vector of output channels at least.
// - rows (manual_small): any size. A task per (ci, co) computes its whole kernel plane, the
//   reduction in vectors along the gradient's rows (an rfactor over the row's lanes, at most 8:
//   gradient rows are short) with the taps innermost, so each gradient vector is loaded once for
//   every tap.
inline std::vector<int64_t> manual_conv_grad_weight(gen::Pipeline& p, const Halide::Target& t,
                                                    bool small) {
  Var kx = p.vars[0], ky = p.vars[1], c = p.vars[2], n = p.vars[3], task("task");
  auto r = p.acc.rvars(0);                // gradient x, gradient y, image
  std::vector<Var> pv = p.padded.args();  // (x, y, channel, image)
  Expr dense_groups = p.int_attr("groups") == 1;
  if (small) {
    int v = std::min(vector_lanes(t, p.in_dtype), 8);
    Var u("u");
    p.out.fuse(c, n, task).parallel(task);
    Halide::RVar rxo("rxo"), rxi("rxi");
    Func lanes =
        p.acc.update(0).split(r[0], rxo, rxi, v, TailStrategy::GuardWithIf).rfactor(rxi, u);
    p.acc.compute_at(p.out, task);
    lanes.compute_at(p.out, task).vectorize(u);
    lanes.update(0).reorder(u, kx, ky, rxo, r[1], r[2], c, n).vectorize(u);
    p.padded.compute_root().parallel(pv[3]).vectorize(pv[0], v, TailStrategy::GuardWithIf);
    lanes.update(0).specialize(p.int_attr("stride_w") == 1 && p.int_attr("dil_w") == 1 &&
                               dense_groups);
    return {};
  }
  int v = vector_lanes(t, p.in_dtype);
  const int tco = 8;
  Var cio("cio"), cii("cii"), coo("coo"), coi("coi");
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr wide = ob.dim(2).extent() >= v;
  // Where there are fewer input channels than a vector (a first layer's one), the vector runs
  // along the output channels instead, over an NHWC copy of the gradient.
  p.out.specialize(wide)
      .split(c, cio, cii, v)
      .split(n, coo, coi, tco)
      .reorder(cii, coi, kx, ky, cio, coo)
      .fuse(cio, coo, task)
      .parallel(task)
      .vectorize(cii)
      .unroll(coi);
  p.out.split(n, coo, coi, v)
      .reorder(coi, kx, ky, c, coo)
      .fuse(c, coo, task)
      .parallel(task)
      .vectorize(coi);
  p.acc.compute_at(p.out, kx);
  p.acc.specialize(wide).vectorize(c).unroll(n);
  p.acc.vectorize(n);
  p.acc.update(0)
      .specialize(wide && dense_groups)
      .reorder(c, n, r[0], r[1], r[2])
      .vectorize(c)
      .unroll(n);
  p.acc.update(0).specialize(wide).reorder(c, n, r[0], r[1], r[2]).vectorize(c).unroll(n);
  p.acc.update(0).specialize(dense_groups).reorder(n, r[0], r[1], r[2]).vectorize(n);
  p.acc.update(0).reorder(n, r[0], r[1], r[2]).vectorize(n);
  p.padded.compute_root()
      .reorder_storage(pv[2], pv[0], pv[1], pv[3])
      .reorder(pv[2], pv[0], pv[1], pv[3])
      .parallel(pv[3])
      .vectorize(pv[2], v, TailStrategy::GuardWithIf);
  Func grad_nhwc = p.inputs[1].in(p.acc);  // conv2d_backward_weight's inputs: in, grad
  std::vector<Var> gv = grad_nhwc.args();
  grad_nhwc.compute_root()
      .reorder_storage(gv[2], gv[0], gv[1], gv[3])
      .reorder(gv[2], gv[0], gv[1], gv[3])
      .parallel(gv[3])
      .vectorize(gv[2], v, TailStrategy::GuardWithIf);
  return {1, 1, 1, v};
}

inline std::vector<int64_t> manual_window(gen::Pipeline& p, const Halide::Target& t, bool small) {
  int v = vector_lanes(t, p.in_dtype);
  Var w = p.vars[0], h = p.vars[1], c = p.vars[2], n = p.vars[3];
  Var wo("wo"), wi("wi"), co("co"), ci("ci"), task("task");
  auto kind = dsl::WindowKind(p.variant_flags);
  if (kind == dsl::WindowKind::conv_grad_weight) return manual_conv_grad_weight(p, t, small);
  // conv2d_backward_input is a convolution of the gradient: it gets conv2d's schedule.
  bool conv = kind == dsl::WindowKind::conv || kind == dsl::WindowKind::conv_grad_input;
  if (small || !conv) {
    // A parallel task is a group of image planes: one small plane (a 24 x 24 pool's) is less work
    // than handing a task to a thread costs.
    Var plane("plane");
    Halide::OutputImageParam ob = p.out.output_buffers()[0];
    p.out.fuse(c, n, task)
        .split(task, task, plane, iterations_per_task(ob.dim(0).extent() * ob.dim(1).extent()),
               TailStrategy::GuardWithIf)
        .parallel(task)
        .vectorize(w, v, TailStrategy::GuardWithIf);
    // Per-window results (max_pool2d_backward's argmax) once per image plane, not per use.
    for (Func& f : p.reductions) {
      std::vector<Var> fv = f.args();
      f.compute_at(p.out, plane).vectorize(fv[0], v, TailStrategy::GuardWithIf);
      f.update(0).vectorize(fv[0], v, TailStrategy::GuardWithIf);
    }
    if (conv) return {};
    // The image with its zero border, one plane at a time: the taps then load vectors rather
    // than clamp each lane.
    std::vector<Var> pv = p.padded.args();
    p.padded.compute_at(p.out, plane).vectorize(pv[0], v, TailStrategy::GuardWithIf);
    // The pools' geometry is a run-time attribute: the common 2x2 pool of stride 2 gets a branch
    // of its own, where the windows' positions are shifts rather than divisions and the loops
    // over taps and windows have constant extents.
    Expr two = p.int_attr("kernel_w") == 2 && p.int_attr("kernel_h") == 2 &&
               p.int_attr("stride_w") == 2 && p.int_attr("stride_h") == 2 &&
               p.int_attr("pad_w") == 0 && p.int_attr("pad_h") == 0;
    p.out.specialize(two);
    auto unrolled_taps = [&](Func& f) {
      auto r = f.rvars(0);
      Stage s = f.update(0).specialize(two);
      for (const Halide::RVar& rv : r) s.unroll(rv);
    };
    if (p.acc.has_update_definition()) unrolled_taps(p.acc);
    for (Func& f : p.reductions) unrolled_taps(f);
    return {};
  }
  // Register tile: `lanes` along w x 8 output channels; the reduction over (kx, ky, ci) runs
  // inside it. Whole tiles only. A whole vector where the output is that wide, else half of one:
  // the second layer of a small CNN is 8 wide, under AVX-512's 16 float lanes.
  const int tc = 8, half = std::max(v / 2, 1);
  auto tile = [&](Stage s, int lanes) {
    s.split(w, wo, wi, lanes)
        .split(c, co, ci, tc)
        .reorder(wi, ci, wo, h, co, n)
        .fuse(h, co, task)
        .fuse(task, n, task)
        .parallel(task)
        .vectorize(wi)
        .unroll(ci);
  };
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr wide = ob.dim(0).extent() >= v;  // a whole vector of outputs along w
  if (half < v) tile(p.out.specialize(wide), v);
  tile(p.out, half);
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
  // conv2d_backward_input also picks its gradient rows by the vertical stride.
  if (kind == dsl::WindowKind::conv_grad_input)
    unit = unit && p.int_attr("stride_h") == 1 && p.int_attr("dil_h") == 1;
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
