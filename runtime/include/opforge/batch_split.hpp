// How a training step's batch is shared among devices: in proportion to each device's measured
// throughput (samples per second), re-estimated after every step from the time each device took
// for its share. Used by data-parallel training (opforge::torch::nn::DataParallel).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace opforge {

class ThroughputSplit {
 public:
  struct Options {
    // Weight of the newest measurement in each device's smoothed throughput (an exponential
    // moving average): small enough that one noisy step moves the split little, large enough
    // that a device whose load changes gets its new share within a few steps.
    double smoothing = 0.5;
    // A new split replaces the current one only if it is predicted to finish the step this much
    // sooner (a fraction of the step's time), so that noise does not make the split oscillate.
    double hysteresis = 0.03;
    // Split by the initial rates whatever is measured (the static split, a baseline for
    // benchmarks).
    bool fixed = false;
  };
  // One device per entry, with the throughput to start from (any positive unit: only the ratios
  // matter until the first measurement; the cores of a CPU device, say).
  explicit ThroughputSplit(std::vector<double> initial_rates);
  ThroughputSplit(std::vector<double> initial_rates, Options options);

  size_t devices() const { return rates_.size(); }
  // The number of samples each device gets of a batch of `batch`: they add up to `batch`, and
  // every device gets at least one while the batch has enough (a device given none could not be
  // measured again).
  std::vector<int64_t> split(int64_t batch);
  // The split proportional to the rates, changing nothing (for a batch that is not a training
  // step's, such as evaluation's).
  std::vector<int64_t> plan(int64_t batch) const;
  // What a step took: the samples each device ran (as split() gave them) and its seconds. A
  // device that ran none, or whose time is not positive and finite, keeps its estimate.
  void record(const std::vector<int64_t>& samples, const std::vector<double>& seconds);
  // The samples per second the split plans each device at: the inverse of its smoothed seconds
  // per sample (the initial rates until it is measured).
  const std::vector<double>& rates() const { return rates_; }
  // Device i leaves the split (it failed); the others keep their estimates.
  void drop(size_t i);
  // A device joins (or returns) at position `at`, planned at `rate` in the rates' unit until its
  // first measurement replaces that.
  void add(size_t at, double rate);
  // The share of a batch each device gets, from the rates (they add up to 1).
  std::vector<double> fractions() const;

 private:
  std::vector<int64_t> proportional(int64_t batch) const;
  double predicted_seconds(const std::vector<int64_t>& samples) const;

  std::vector<double> rates_;       // what the split plans with
  std::vector<double> per_sample_;  // of measured devices: smoothed seconds per sample
  std::vector<bool> measured_;
  Options options_;
  std::vector<int64_t> current_;  // the last split handed out
};

}  // namespace opforge
