// What a DataParallel share tells the layers whose training-mode forward keeps state of its own
// (Dropout's random draws, BatchNorm2d's running statistics), which several devices' threads would
// otherwise change at once: set on a share's thread while it runs a pass, null everywhere else.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "opforge/torch/nn.hpp"

namespace opforge::torch::nn {

struct ShareState {
  ShareState(int64_t first, const std::map<const Module*, uint64_t>* seeds)
      : first_sample(first), dropout_seeds(seeds) {}
  // Where the rows being run start in the step's whole batch: a sample's dropout mask depends on
  // its place in the batch, not on the device or micro-batch that runs it.
  int64_t first_sample = 0;
  // This step's seed for each Dropout module, drawn from its generator on the caller's thread.
  const std::map<const Module*, uint64_t>* dropout_seeds = nullptr;
  // The times each Dropout module ran in this pass (one called twice draws two masks).
  std::map<const Module*, uint64_t> dropout_calls;
  // Each BatchNorm2d call's statistics of its rows, for one update of the running statistics once
  // every share is done.
  struct Stats {
    BatchNorm2d* module;
    BatchNorm2d::RowStats rows;
  };
  std::vector<Stats> batch_stats;
};

// The share the calling thread runs, or null.
ShareState*& current_share();

}  // namespace opforge::torch::nn
