// `opforge train --batch-size auto`: the batch follows the measured throughput and memory
// (opforge/adaptive_batch.hpp) within --batch-min and --batch-max; the learning rate is scaled with
// it (the linear scaling rule: k times the batch, k times the rate); every change is printed and
// kept for the epoch's line of metrics.csv.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "opforge/adaptive_batch.hpp"
#include "opforge/torch/data.hpp"
#include "opforge/torch/optim.hpp"
#include "train.hpp"

namespace opforge::cli {

class AutoBatch {
 public:
  explicit AutoBatch(const TrainOptions& o);
  bool on() const { return control_.has_value(); }
  // The batch now over the batch the run started with (the rate's scale).
  double scale() const;
  // After each step (its samples and seconds, and whether a device ran short of memory): a
  // change of batch goes to the loader and the optimiser's rate, and is printed.
  void after_step(int64_t samples, double seconds, bool memory_pressure,
                  torch::data::DataLoader& loader, torch::optim::Optimizer& opt);
  // The batch now, and the epoch's changes ("step 40 64->128; step 49 128->64"), which it then
  // forgets.
  int64_t batch() const;
  std::string take_changes();

 private:
  std::optional<AdaptiveBatchSize> control_;
  int64_t start_ = 0;
  std::string changes_;
};

}  // namespace opforge::cli
