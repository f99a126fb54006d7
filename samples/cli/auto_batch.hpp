// `opforge train --batch-size auto`: the batch follows the measured throughput and memory
// (opforge/adaptive_batch.hpp) within --batch-min and --batch-max; the learning rate is scaled with
// it (the linear scaling rule: k times the batch, k times the rate); every change is printed and
// kept for the epoch's line of metrics.csv. Over mpirun's ranks (--distributed) the batch is all
// ranks' together, a multiple of their number: rank 0 decides from the ranks' mean step time and
// whether any ran short of memory, and every rank takes its decision.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "opforge/adaptive_batch.hpp"
#include "opforge/torch/data.hpp"
#include "opforge/torch/optim.hpp"
#include "train.hpp"

namespace opforge::cli {

// `batch` made a multiple of `world` within [min, max] rounded inward to multiples (unchanged when
// none lies there: AdaptiveBatchSize then says so).
int64_t batch_for_ranks(int64_t batch, int64_t min, int64_t max, int64_t world);

class AutoBatch {
 public:
  // `o.batch_size` is where the batch starts; rank `rank` of `world` processes.
  AutoBatch(const TrainOptions& o, int rank, int world);
  bool on() const { return control_.has_value(); }
  // The batch now over the batch the run started with (the rate's scale).
  double scale() const { return double(batch_) / double(start_); }
  // After each step (this rank's samples and seconds, and whether one of its devices ran short of
  // memory): a change of batch goes to the loader (this rank's part) and the optimiser's rate,
  // and is printed. Every rank calls it at every step (two small collectives when distributed).
  void after_step(int64_t samples, double seconds, bool memory_pressure,
                  torch::data::DataLoader& loader, torch::optim::Optimizer& opt);
  // The batch now (all ranks'), and the epoch's changes ("step 40 64->128; step 49 128->64"),
  // which it then forgets.
  int64_t batch() const { return batch_; }
  std::string take_changes();
  // A resumed run goes on at the batch its checkpoint had (0: the start; made a multiple of this
  // run's ranks), its rate scaled against the batch the first run started with (`first`; 0:
  // this run's), measuring afresh.
  void resume_at(int64_t batch, int64_t first, torch::data::DataLoader& loader);
  int64_t start() const { return start_; }

 private:
  std::optional<AdaptiveBatchSize> control_;  // rank 0's decides
  AdaptiveBatchSize::Options options_;
  int64_t start_ = 0, batch_ = 0, step_ = 0;
  int rank_ = 0, world_ = 1;
  std::string changes_;
};

}  // namespace opforge::cli
