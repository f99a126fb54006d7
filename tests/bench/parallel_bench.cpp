// The data-parallel benchmark: opforge train's step (time_training) over cpu:0 and cpu:1 with
// one of the two cores loaded, the split measured against the split fixed by cores.
#include "parallel_bench.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "external_load.hpp"
#include "opforge/device.hpp"
#include "opforge/error.hpp"
#include "opforge/torch/distributed.hpp"
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

namespace {
// Runs commands at once and returns the figures each printed as "name value" lines.
std::vector<std::map<std::string, double>> figures_from(const std::vector<std::string>& commands) {
  std::vector<FILE*> pipes;
  for (const std::string& command : commands)
    pipes.push_back(popen((command + " 2>&1").c_str(), "r"));
  std::vector<std::string> outputs(commands.size());
  std::vector<int> rcs(commands.size(), -1);
  for (size_t i = 0; i < commands.size(); i++) {  // each prints a few lines: no pipe fills
    if (!pipes[i]) continue;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, pipes[i])) outputs[i].append(buf, n);
    rcs[i] = pclose(pipes[i]);
  }
  std::vector<std::map<std::string, double>> all(commands.size());
  for (size_t i = 0; i < commands.size(); i++) {
    OPFORGE_CHECK(pipes[i]) << "bench --distributed: cannot run " << commands[i];
    OPFORGE_CHECK(rcs[i] == 0) << "bench --distributed: `" << commands[i] << "` failed:\n"
                               << outputs[i];
    std::istringstream lines(outputs[i]);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      std::string name;
      double v = 0;
      if (in >> name >> v && in.eof()) all[i][name] = v;
    }
  }
  return all;
}
std::map<std::string, double> figures_from(const std::string& command) {
  return figures_from(std::vector<std::string>{command})[0];
}
double figure(const std::map<std::string, double>& f, const std::string& name,
              const std::string& command) {
  auto it = f.find(name);
  OPFORGE_CHECK(it != f.end()) << "bench --distributed: `" << command << "` printed no " << name;
  return it->second;
}
}  // namespace

int run_mpi_worker(int64_t batch_size) {
  TrainOptions o;
  o.batch_size = batch_size;
  o.distributed = torch::distributed::available() && torch::distributed::launched();
  TrainTiming t = time_training(o, 60, 10);
  const bool lead = !o.distributed || torch::distributed::rank() == 0;
  if (o.distributed && torch::distributed::world_size() > 1) {
    // One all-reduce of tensors the size of the model's gradients, timed alone.
    Generator g(0);
    std::vector<Tensor> grads;
    for (const Tensor& p : make_model(o.model, g)->parameters())
      grads.push_back(Tensor::ones(p.shape(), p.dtype()));
    std::vector<double> ms;
    for (int k = 0; k < 21; k++) {
      torch::distributed::barrier();
      auto t0 = std::chrono::steady_clock::now();
      torch::distributed::all_reduce_mean(grads);
      ms.push_back(1e3 *
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (lead) std::cout << "allreduce_ms " << median(ms) << "\n";
  }
  if (lead)
    std::cout << "samples_per_second " << t.samples_per_second << "\nstep_ms "
              << t.data_ms + t.forward_ms + t.backward_ms + t.optimizer_ms << "\ndata_ms "
              << t.data_ms << "\nforward_ms " << t.forward_ms << "\nbackward_ms " << t.backward_ms
              << "\nreduce_ms " << t.reduce_ms << "\noptimizer_ms " << t.optimizer_ms << std::endl;
  return 0;
}

MpiScaling run_mpi_scaling(const std::string& exe, int rounds, int64_t batch_size) {
  MpiScaling r;
#ifndef OPFORGE_MPIEXEC
  r.why_not = "no mpirun was found when opforge was configured";
  return r;
#else
  if (!torch::distributed::available()) {
    r.why_not = "this build has no MPI (libopenmpi-dev)";
    return r;
  }
  const std::string args = " bench --mpi-worker --batch-size " + std::to_string(batch_size);
  // Children without the logical devices this benchmark's first part runs on.
  const std::string one = "env -u OPFORGE_CPU_DEVICES HL_NUM_THREADS=1 taskset -c 0 " + exe + args;
  const std::string two = std::string("env -u OPFORGE_CPU_DEVICES ") + OPFORGE_MPIEXEC +
                          " --allow-run-as-root --oversubscribe -np 2 --bind-to core -x "
                          "HL_NUM_THREADS=1 " +
                          exe + args;
  // The same step as two processes of half the batch, started at once, that never talk.
  const std::string half = " bench --mpi-worker --batch-size " + std::to_string(batch_size / 2);
  const std::vector<std::string> pair = {
      "env -u OPFORGE_CPU_DEVICES HL_NUM_THREADS=1 taskset -c 0 " + exe + half,
      "env -u OPFORGE_CPU_DEVICES HL_NUM_THREADS=1 taskset -c 1 " + exe + half};
  std::vector<double> a, b, c, allreduce, wait, step;
  for (int k = 0; k < rounds; k++) {
    auto f1 = figures_from(one);
    a.push_back(figure(f1, "samples_per_second", one));
    step.push_back(figure(f1, "step_ms", one));
    auto f2 = figures_from(two);
    b.push_back(figure(f2, "samples_per_second", two));
    allreduce.push_back(figure(f2, "allreduce_ms", two));
    wait.push_back(figure(f2, "reduce_ms", two));
    auto f3 = figures_from(pair);
    c.push_back(2 * std::min(figure(f3[0], "samples_per_second", pair[0]),
                             figure(f3[1], "samples_per_second", pair[1])));
  }
  r.ran = true;
  r.one_process = median(a);
  r.two_ranks = median(b);
  r.efficiency = r.two_ranks / (2 * r.one_process);
  r.without_communication = median(c);
  r.efficiency_without_communication = r.without_communication / (2 * r.one_process);
  r.allreduce_ms = median(allreduce);
  r.reduce_ms = median(wait);
  r.step_ms = median(step);
  return r;
#endif
}

}  // namespace opforge::cli
