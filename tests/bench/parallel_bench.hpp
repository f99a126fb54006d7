// `opforge bench --distributed`: data-parallel training (nn::DataParallel) on two logical CPU
// devices of one core each while another process keeps one of the two cores busy: the batch split
// by measured throughput against the static split by cores (equal), alternated in one run.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opforge::cli {

struct ParallelBenchOptions {
  std::string model = "mlp";
  int64_t batch_size = 128;
  int repeats = 3;  // alternated rounds; medians are reported
  int64_t steps = 40, warmup = 10;
  int loaded_device = 1;  // whose first core the external process keeps busy
};

struct SplitRun {
  double samples_per_second = 0;  // median over the rounds
  // Milliseconds per step (medians): the devices' forward and backward passes, the optimiser's
  // step, waiting for the batch.
  double passes_ms = 0, optimizer_ms = 0, data_ms = 0;
  std::vector<std::pair<std::string, double>> split;  // each device's share, last round
  std::vector<double> share_ms;  // each device's milliseconds per step for its share, last round
};

struct ParallelBenchResult {
  SplitRun measured, fixed;  // the load-driven split; the static one
  double ratio = 0;          // measured / fixed samples per second
};

// Needs at least two logical CPU devices (OPFORGE_CPU_DEVICES); throws an Error otherwise.
ParallelBenchResult run_parallel_bench(const ParallelBenchOptions& o);

}  // namespace opforge::cli
