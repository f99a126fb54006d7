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
}

inline void gpu_movement(gen::Pipeline& p) { gpu_flat(p, 128); }

}  // namespace opforge::schedules
