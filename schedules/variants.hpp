// The schedule variants the build produces for each family, and the CPU targets each is compiled
// for. An autoscheduled variant is only good near the size it was estimated for, so the families
// whose speed depends most on shape get several estimate sizes; the runtime picks among them.
#pragma once
#include <string>
#include <vector>

#include "opforge/dsl/op.hpp"

namespace opforge::schedules {

enum class Scheduler { manual, adams2019, mullapudi2016, gpu_manual, li2018 };

struct Variant {
  std::string name;
  Scheduler scheduler;
  int64_t estimate = 0;  // size handed to the family's set_estimates; 0 for manual
};

inline std::vector<Variant> variants_for(dsl::Family f) {
  using dsl::Family;
  std::vector<Variant> v = {{"manual", Scheduler::manual}};
  auto both = [&](int64_t size, const std::string& suffix) {
    v.push_back({"adams2019" + suffix, Scheduler::adams2019, size});
    v.push_back({"mullapudi2016" + suffix, Scheduler::mullapudi2016, size});
  };
  switch (f) {
    case Family::elementwise:
    case Family::movement:
      both(1 << 14, "");
      break;
    case Family::reduction:
      both(64, "");
      break;
    case Family::contraction:
      v.push_back({"manual_packed", Scheduler::manual});
      v.push_back({"manual_small", Scheduler::manual});
      both(128, "_s128");
      both(1024, "_s1024");
      break;
    case Family::window:
      v.push_back({"manual_small", Scheduler::manual});
      both(16, "_s16");
      both(56, "_s56");
      break;
  }
  return v;
}

// GPU variants: a hand GPU schedule and Li2018, the only Halide 14 autoscheduler that emits GPU
// schedules (Adams2019 and Mullapudi2016 silently schedule for the CPU on a GPU target).
inline std::vector<Variant> gpu_variants_for(dsl::Family f) {
  int64_t estimate = f == dsl::Family::contraction ? 128
                     : f == dsl::Family::window    ? 16
                     : f == dsl::Family::reduction ? 64
                                                   : 1 << 14;
  return {{"gpu", Scheduler::gpu_manual}, {"li2018", Scheduler::li2018, estimate}};
}

// Backward kernels get the hand schedules and one autoscheduler per device kind (Mullapudi2016 on
// the CPU, Li2018 on GPUs): a pointwise gradient leaves an autoscheduler little to choose, and
// every variant costs build time (README: the build budget). The window family's gradients get it
// at one estimate size: its autoscheduled convolutions are far behind the hand schedule (README).
inline bool backward_variant(dsl::Family f, const Variant& v) {
  if (v.scheduler == Scheduler::adams2019) return false;
  return f != dsl::Family::window || v.scheduler != Scheduler::mullapudi2016 || v.estimate == 16;
}

// A schedule that computes wrong results is not a variant: these are left out of the build.
// Li2018's GPU schedules of the window ops (conv2d, the pools) let work-groups race: under PoCL
// with several threads their results differ from run to run (conv2d on strided inputs: 1 to 1 900
// of 4 096 values; avg_pool2d float64 on dense ones: about 100), with POCL_MAX_PTHREAD_COUNT=1 they
// are right. The schedules are the same on CUDA, so they are left out there too.
inline const char* left_out_reason(dsl::Family f, const Variant& v, bool gpu) {
  if (gpu && v.scheduler == Scheduler::li2018 && f == dsl::Family::window)
    return "Li2018's GPU schedules of window ops race between work-groups (wrong results under "
           "PoCL)";
  return nullptr;
}

struct CpuTarget {
  std::string tag;     // what the runtime calls it
  std::string halide;  // Halide target string (no_runtime: one shared runtime is linked)
  // Only the hand schedules: the baseline level is a fallback for CPUs older than AVX2 (before
  // 2013), not worth an autoscheduled copy of every kernel.
  bool hand_schedules_only = false;
};

// Never `host`: the library runs on machines other than the build machine. `user_context` makes
// every kernel carry the logical CPU device whose thread pool runs its parallel loops.
inline std::vector<CpuTarget> cpu_targets() {
  return {{"avx512",
           "x86-64-linux-sse41-avx-f16c-fma-avx2-avx512-avx512_skylake-user_context-no_runtime"},
          {"avx2", "x86-64-linux-sse41-avx-f16c-fma-avx2-user_context-no_runtime"},
          {"sse41", "x86-64-linux-sse41-user_context-no_runtime", true}};
}

// GPU targets: host code for the baseline x86 level, device code for the GPU API. `cl_doubles`
// lets float64 kernels run on OpenCL devices that support doubles and `cl_atomics64` int64
// reductions that Li2018 schedules with atomics (PoCL supports both).
// CUDA: PTX for compute capability 7.0, which the driver compiles for any newer GPU. Halide emits
// the PTX itself and the runtime loads libcuda when first used, so building needs no GPU.
inline std::vector<CpuTarget> gpu_targets(bool cuda) {
  std::vector<CpuTarget> t = {
      {"opencl", "x86-64-linux-sse41-opencl-cl_doubles-cl_atomics64-user_context-no_runtime"}};
  if (cuda)
    t.push_back({"cuda", "x86-64-linux-sse41-cuda-cuda_capability_70-user_context-no_runtime"});
  return t;
}

// The union of every target's features: the one shared runtime must hold each device API.
inline std::string runtime_target(bool cuda) {
  return std::string("x86-64-linux-sse41-opencl-cl_doubles-cl_atomics64-user_context") +
         (cuda ? "-cuda-cuda_capability_70" : "");
}

// IEEE semantics (NaN and Inf propagate, no fast-math folding of NaN checks) for the families whose
// results users compare against NumPy at special values. Contraction and window kernels keep
// fast math: strict_float would forbid fused multiply-adds and halve their throughput.
inline bool strict_float(dsl::Family f) {
  return f == dsl::Family::elementwise || f == dsl::Family::reduction || f == dsl::Family::movement;
}

// Machine description for the autoschedulers: parallelism, last-level cache, load/compute
// balance. A generic multi-core x86 server; autotuning on the target refines it.
inline const char* kMachineParams = "16,16777216,40";

}  // namespace opforge::schedules
