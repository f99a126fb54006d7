// The hand schedules (CPU and GPU) of movement ops: copies as elementwise kernels, gathers by row.
#pragma once
#include "schedules/common.hpp"
#include "schedules/elementwise.hpp"

namespace opforge::schedules {

inline void manual_movement(gen::Pipeline& p, const Halide::Target& t) {
  if (p.variant_flags == int(dsl::MovementKind::copy)) {
    manual_elementwise(p, t);
    return;
  }
  int v = vector_lanes(t, p.in_dtype);
  Halide::OutputImageParam ob = p.out.output_buffers()[0];
  p.out.specialize(ob.dim(0).extent() >= v).parallel(p.vars[2]).vectorize(p.vars[0], v);
  p.out.parallel(p.vars[2]);
  if (p.variant_flags == int(dsl::MovementKind::index_add)) {
    // The rows added, one after another (two may land on one row), each in vectors along i.
    Var i = p.vars[0], o = p.vars[2];
    Halide::RVar r = p.out.rvars(0)[0];
    p.out.update(0).reorder(i, r, o);
    p.out.update(0)
        .specialize(ob.dim(0).extent() >= v)
        .parallel(o)
        .vectorize(i, v, TailStrategy::GuardWithIf);
    p.out.update(0).parallel(o);
  }
}

// index_add's rows are added by the thread of each (i, o), in order.
inline void gpu_movement(gen::Pipeline& p) {
  gpu_flat(p, 128);
  if (p.variant_flags != int(dsl::MovementKind::index_add)) return;
  Var i = p.vars[0], o = p.vars[2], f("f"), b("b"), th("th");
  p.out.update(0).fuse(i, o, f).gpu_tile(f, b, th, 128, TailStrategy::GuardWithIf);
}

}  // namespace opforge::schedules
