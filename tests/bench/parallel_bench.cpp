// The data-parallel benchmark: opforge train's step (time_training) over cpu:0 and cpu:1 with
// one of the two cores loaded, the split measured against the split fixed by cores.
#include "parallel_bench.hpp"

#include <optional>

#include "external_load.hpp"
#include "opforge/device.hpp"
#include "opforge/error.hpp"
#include "timing.hpp"
#include "train.hpp"

namespace opforge::cli {

ParallelBenchResult run_parallel_bench(const ParallelBenchOptions& o) {
  int cpus = 0;
  for (const DeviceStats& s : device_stats()) cpus += s.device.kind == DeviceKind::cpu;
  OPFORGE_CHECK(cpus >= 2) << "bench --distributed needs two logical CPU devices; set "
                              "OPFORGE_CPU_DEVICES, for example \"0;1\" (found "
                           << cpus << ")";
  OPFORGE_CHECK(o.repeats >= 1 && o.steps >= 1 && o.warmup >= 0)
      << "bench --distributed: repeats and steps must be positive";
  TrainOptions measured;
  measured.model = o.model;
  measured.batch_size = o.batch_size;
  measured.devices = "cpu:0,cpu:1";
  TrainOptions fixed_split = measured;
  fixed_split.fixed_split = true;

  ExternalLoad load(first_core_of(o.loaded_device));
  std::vector<TrainTiming> a, b;
  ParallelBenchResult r;
  for (int k = 0; k < o.repeats; k++) {
    b.push_back(time_training(fixed_split, o.steps, o.warmup));
    a.push_back(time_training(measured, o.steps, o.warmup));
  }
  auto summary = [](const std::vector<TrainTiming>& runs) {
    auto med = [&](double TrainTiming::*field) {
      std::vector<double> v;
      for (const TrainTiming& t : runs) v.push_back(t.*field);
      return median(v);
    };
    return SplitRun{med(&TrainTiming::samples_per_second),
                    med(&TrainTiming::forward_ms),
                    med(&TrainTiming::optimizer_ms),
                    med(&TrainTiming::data_ms),
                    runs.back().split,
                    runs.back().share_ms};
  };
  r.measured = summary(a);
  r.fixed = summary(b);
  r.ratio = r.measured.samples_per_second / r.fixed.samples_per_second;
  return r;
}

}  // namespace opforge::cli
