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

// Two MPI ranks of one core each against one process on one core (`exe bench --mpi-worker`, run
// alternately by mpirun and by taskset): the scaling efficiency, ranks / (2 x one process), and
// the time one all-reduce of the model's gradients takes between the two ranks.
struct MpiScaling {
  bool ran = false;
  std::string why_not;                    // when it did not run: no MPI in this build, no mpirun
  double one_process = 0, two_ranks = 0;  // samples/s, medians
  double efficiency = 0;
  // Two processes on a core each, half the batch each, no MPI and no communication, run at once:
  // twice the slower one's samples/s (synchronous ranks wait for the slower one), and that
  // against two one-core processes: what two ranks could reach here if communicating cost nothing.
  double without_communication = 0, efficiency_without_communication = 0;
  double allreduce_ms = 0;  // median
  double reduce_ms = 0;     // median: a step's wait for the gradients' sums after its backward pass
  double step_ms = 0;       // of one process on one core
};
MpiScaling run_mpi_scaling(const std::string& exe, int rounds, int64_t batch_size);
// The worker: opforge train's step timed as this rank (or alone), printed as
// "samples_per_second X", "step_ms X", each phase's "..._ms X" and, between ranks, "allreduce_ms X"
// by rank 0.
int run_mpi_worker(int64_t batch_size);

}  // namespace opforge::cli
