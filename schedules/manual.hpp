// The hand-written schedules, CPU and GPU, of each family. A CPU schedule returns the call
// extents below which it is invalid (empty: valid for every shape); register-tiled schedules need
// whole tiles, so those families also get a "manual_small" variant without a minimum for the
// shapes below it. Each family's schedules are a file of their own (schedules/<family>.hpp), so a
// kernel's cache key holds only its own family's (cmake/OpforgeKernels.cmake).
#pragma once
#include <string>
#include <vector>

#include "schedules/contraction.hpp"
#include "schedules/elementwise.hpp"
#include "schedules/movement.hpp"
#include "schedules/reduction.hpp"
#include "schedules/window.hpp"

namespace opforge::schedules {

inline std::vector<int64_t> schedule_manual(gen::Pipeline& p, const Halide::Target& t,
                                            const std::string& variant) {
  bool small = variant == "manual_small", packed = variant == "manual_packed";
  switch (p.family) {
    case dsl::Family::elementwise:
      manual_elementwise(p, t);
      break;
    case dsl::Family::reduction:
      manual_reduction(p, t);
      break;
    case dsl::Family::contraction:
      return manual_contraction(p, t, small, packed);
    case dsl::Family::window:
      return manual_window(p, t, small);
    case dsl::Family::movement:
      manual_movement(p, t);
      break;
  }
  return {};
}

inline std::vector<int64_t> schedule_gpu(gen::Pipeline& p) {
  switch (p.family) {
    case dsl::Family::elementwise:
      gpu_elementwise(p);
      break;
    case dsl::Family::reduction:
      gpu_reduction(p);
      break;
    case dsl::Family::contraction:
      gpu_contraction(p);
      break;
    case dsl::Family::window:
      gpu_window(p);
      break;
    case dsl::Family::movement:
      gpu_movement(p);
      break;
  }
  return {};
}

}  // namespace opforge::schedules
