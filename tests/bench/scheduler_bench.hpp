// `opforge bench --scheduler`: throughput of a stream of independent mixed-size ops (matmuls and
// elementwise chains) on two logical CPU devices of one core each while another process keeps one
// of the two cores busy, under the load-aware policy, static round-robin, and every fixed
// placement of the two kinds of work.
#pragma once
#include <string>
#include <vector>

namespace opforge::cli {

struct SchedulerBenchOptions {
  int items = 240;  // stream length: half matmuls, half elementwise chains
  int repeats = 3;  // timed passes per policy; the median is reported
  int window = 16;  // items in flight before the stream waits for the oldest
  bool external_load = true;
  int loaded_device = 1;  // whose first core the external process keeps busy
};

struct PolicyResult {
  std::string policy;           // "auto", "round_robin", "fixed mm->cpu:0 ew->cpu:1", ...
  double items_per_second = 0;  // median over repeats
  std::vector<double> share;    // fraction of the kernel calls run on each device
};

struct SchedulerBenchResult {
  std::vector<PolicyResult> policies;
  std::string best_fixed;
  double vs_round_robin = 0;  // auto / round_robin throughput
  double vs_best_fixed = 0;   // auto / best fixed placement throughput
};

// Needs at least two logical CPU devices (OPFORGE_CPU_DEVICES); throws an Error otherwise.
SchedulerBenchResult run_scheduler_bench(const SchedulerBenchOptions& options);

}  // namespace opforge::cli
