// The hand schedules (CPU and GPU) of reductions: rows, columns, normalising ops, per-channel
// statistics.
#pragma once
#include <algorithm>

#include "schedules/common.hpp"

namespace opforge::schedules {

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

// A per_channel op's out(k) (normalisation's per-channel sums), or a channel_normalize op's
// per-channel outputs: the channels in parallel, each channel's reductions over (i, o) computed at
// it, in vector lanes along i where i is contiguous and a vector long (NCHW: a channel's H x W
// plane; a row_normalize op's row: layer_norm's). Where instead each row o holds the channels side
// by side (i of extent 1, k contiguous: layer_norm's view (1, D, rows), batch_norm over (N, C)), a
// channel's values lie a row apart, so the sums run as PyTorch's CPU kernels do: chunks of rows in
// parallel, each adding its rows into a partial sum per channel with vectors along the channels,
// and a channel's result the sum of its chunks' partials. Reductions that do not depend on the
// channel (statistics per row that a definition reduces itself) are computed once, before.
inline void manual_per_channel(gen::Pipeline& p, Func channels, const Halide::Target& t) {
  int v = vector_lanes(t, p.in_dtype);
  Var k = channels.args()[0], kt("kt");
  const Halide::ImageParam& in = p.inputs[0];
  // Channels in tasks of 2^15 elements or more: in the layout of rows below a channel's own work
  // is only the sum of its chunks' partials.
  channels
      .split(k, kt, k, iterations_per_task(in.dim(0).extent() * in.dim(2).extent()),
             TailStrategy::GuardWithIf)
      .parallel(kt);
  Expr unit = Halide::Internal::const_true(), rows = Halide::Internal::const_true();
  for (const Halide::ImageParam& in : p.inputs)
    if (in.dimensions() == 3) {
      unit = unit && in.dim(0).stride() == 1 && in.dim(0).extent() >= v;
      rows = rows && in.dim(0).extent() == 1 && in.dim(1).stride() == 1;
    }
  rows = rows && in.dim(1).extent() >= v;
  // Chunks of rows: a few tasks per core, none shorter than 8 rows.
  Expr chunk = Halide::max((in.dim(2).extent() + 15) / 16, 8);
  for (Func& f : p.reductions) {
    bool per_channel = false;
    for (const Var& a : f.args()) per_channel = per_channel || a.name() == k.name();
    if (!per_channel) {
      f.compute_root();
      if (!f.args().empty()) f.update(0).parallel(f.args().back());
      continue;
    }
    f.compute_at(channels, k);
    in_vector_lanes(f.update(0).specialize(unit), f.rvars(0)[0], 4 * v,
                    Halide::LoopLevel(channels, k));
    // A sum that reads another channel's result (batch_norm's variance, its mean) needs that
    // result before its chunks, which would move the channels' sums out of their loop for every
    // layout: it keeps the one above.
    auto calls = Halide::Internal::find_transitive_calls(f.function());
    auto per_channel_other = [&](const Func& g) {
      const std::vector<Var> args = g.args();
      return g.name() != f.name() && calls.count(g.name()) &&
             std::any_of(args.begin(), args.end(),
                         [&](const Var& a) { return a.name() == k.name(); });
    };
    if (std::any_of(p.reductions.begin(), p.reductions.end(), per_channel_other)) continue;
    Halide::RVar across_i = f.rvars(0)[0], across_o = f.rvars(0)[1], oc("oc"), oi("oi");
    Var c("c");
    Func parts = f.update(0)
                     .specialize(rows)
                     .split(across_o, oc, oi, chunk, TailStrategy::GuardWithIf)
                     .rfactor(oc, c);
    parts.compute_at(channels, Var::outermost()).vectorize(k, v, TailStrategy::GuardWithIf);
    parts.update(0)
        .reorder(k, across_i, oi, c)
        .vectorize(k, v, TailStrategy::GuardWithIf)
        .parallel(c);
  }
}

// A channel_normalize op: its per-channel outputs first, as above, then out(i, k, o) pointwise
// over them: each (k, o) plane along i in vectors where i is contiguous and a vector long (NCHW),
// else, with one value a plane ((N, C) inputs), along k in vectors; planes in parallel tasks.
inline void manual_channel_normalize(gen::Pipeline& p, const Halide::Target& t) {
  manual_per_channel(p, p.side, t);
  int v = vector_lanes(t, p.in_dtype);
  Var i = p.vars[0], k = p.vars[1], o = p.vars[2], plane("plane"), task("task"), ot("ot");
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  Expr along_i = ob.dim(0).stride() == 1 && ob.dim(0).extent() >= v;
  Expr along_k = ob.dim(0).extent() == 1 && ob.dim(1).stride() == 1;
  for (const Halide::ImageParam& in : p.inputs)
    if (in.dimensions() == 3) {
      along_i = along_i && in.dim(0).stride() == 1;
      along_k = along_k && in.dim(1).stride() == 1;
    }
  p.out.specialize(along_i)
      .vectorize(i, v, TailStrategy::GuardWithIf)
      .fuse(k, o, plane)
      .split(plane, task, plane, iterations_per_task(ob.dim(0).extent()), TailStrategy::GuardWithIf)
      .parallel(task);
  p.out.specialize(along_k)
      .vectorize(k, v, TailStrategy::GuardWithIf)
      .split(o, ot, o, iterations_per_task(ob.dim(1).extent()), TailStrategy::GuardWithIf)
      .parallel(ot);
  p.out.fuse(k, o, plane)
      .split(plane, task, plane, iterations_per_task(ob.dim(0).extent()), TailStrategy::GuardWithIf)
      .parallel(task);
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
  if (p.side.defined()) return manual_channel_normalize(p, t);
  if (p.vars.size() == 1) return manual_per_channel(p, p.out, t);
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
  // Inputs of in's shape (a gradient's) are laid out as it is.
  for (const Halide::ImageParam& like : p.inputs)
    if (like.dimensions() == 3 && like.name() != in.name()) {
      rows = rows && like.dim(1).stride() == 1;
      cols = cols && like.dim(0).stride() == 1;
    }
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

// Per-channel results on a GPU (a per_channel op's out, a channel_normalize op's side): a block
// per channel, whose threads each reduce a strided part of the channel's (i, o) values (adjacent
// threads read adjacent elements), then one thread combines their partial results; a thread per
// channel left all but 32 of a GPU's threads idle for a CNN layer's statistics. Reductions that do
// not depend on the channel (statistics per row that a definition reduces itself) are kernels of
// their own before it, a thread per row: inside the channels' blocks every channel would reduce
// every row again (rows x D^2 work).
inline void gpu_channels(gen::Pipeline& p, Func channels, int threads) {
  Var k = channels.args()[0];
  channels.gpu_blocks(k);
  for (Func& f : p.reductions) {
    bool per_channel = false;
    for (const Var& a : f.args()) per_channel = per_channel || a.name() == k.name();
    if (!per_channel) {
      if (f.args().empty()) continue;
      Var row = f.args().back(), b("b"), t("t");
      f.compute_root().gpu_tile(row, b, t, threads, TailStrategy::GuardWithIf);
      f.update(0).gpu_tile(row, b, t, threads, TailStrategy::GuardWithIf);
      continue;
    }
    f.compute_at(channels, k);
    std::vector<Halide::RVar> across = f.rvars(0);
    if (f.outputs() != 1 || across.size() != 2) continue;  // reduced by the block's one thread
    Halide::RVar both("both"), ro("ro"), ri("ri");
    Var u("u");
    Func parts = f.update(0)
                     .fuse(across[0], across[1], both)
                     .split(both, ro, ri, threads, TailStrategy::GuardWithIf)
                     .rfactor(ri, u);
    parts.compute_at(channels, k).gpu_threads(u).update(0).gpu_threads(u);
  }
}

// A normalize op's output keeps the reduced axis: a block per row; a reduce op's, a thread per
// output; per-channel results a block per channel (above), and a channel_normalize op's out then a
// thread per element.
inline void gpu_reduction(gen::Pipeline& p) {
  if (p.side.defined()) {
    gpu_channels(p, p.side, 128);
    Var f("f"), b("b"), th("th");
    p.out.fuse(p.vars[0], p.vars[1], f)
        .fuse(f, p.vars[2], f)
        .gpu_tile(f, b, th, 128, TailStrategy::GuardWithIf);
  } else if (p.vars.size() == 3) {
    gpu_rows(p, 128);
  } else if (p.vars.size() == 1) {
    gpu_channels(p, p.out, 128);
  } else {
    gpu_flat(p, 128);
  }
}

}  // namespace opforge::schedules
