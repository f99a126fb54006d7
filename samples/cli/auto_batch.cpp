#include "auto_batch.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <vector>

#include "opforge/torch/distributed.hpp"

namespace opforge::cli {

int64_t batch_for_ranks(int64_t batch, int64_t min, int64_t max, int64_t world) {
  const int64_t lo = (min + world - 1) / world * world, hi = max / world * world;
  return lo > hi ? batch : std::clamp(batch / world * world, lo, hi);
}

AutoBatch::AutoBatch(const TrainOptions& o, int rank, int world)
    : start_(o.batch_size), batch_(o.batch_size), rank_(rank), world_(world) {
  if (!o.batch_auto) return;
  options_.min = o.batch_min;
  options_.max = o.batch_max;
  options_.multiple = world;
  control_.emplace(o.batch_size, options_);
}

void AutoBatch::resume_at(int64_t batch, int64_t first, torch::data::DataLoader& loader) {
  if (!on()) return;
  if (first > 0) start_ = first;
  if (batch == 0) return;
  batch = batch_for_ranks(batch, options_.min, options_.max, world_);
  if (batch == batch_) return;
  control_.emplace(batch, options_);  // refuses a batch outside the bounds
  batch_ = batch;
  loader.set_batch_size(batch / world_);
}

void AutoBatch::after_step(int64_t samples, double seconds, bool memory_pressure,
                           torch::data::DataLoader& loader, torch::optim::Optimizer& opt) {
  if (!on()) return;
  step_++;
  bool short_of_memory = memory_pressure;
  if (world_ > 1) {  // the ranks' mean step time, and whether any ran short
    Tensor shared = Tensor::from_vector(std::vector<double>{seconds, memory_pressure ? 1.0 : 0.0});
    torch::distributed::all_reduce_mean({shared});
    const std::vector<double> v = shared.to_vector<double>();
    seconds = v[0];
    short_of_memory = v[1] > 0;
  }
  std::optional<AdaptiveBatchSize::Change> c;
  if (rank_ == 0) c = control_->record(samples * world_, seconds, short_of_memory);
  int64_t to = c ? c->to : 0;
  if (world_ > 1) {
    Tensor decision = Tensor::from_vector(std::vector<double>{double(to)});
    torch::distributed::broadcast({decision});
    to = int64_t(decision.item());
  }
  if (to == 0) return;
  const int64_t from = batch_;
  batch_ = to;
  loader.set_batch_size(to / world_);
  const double lr = opt.lr();
  opt.set_lr(lr * double(to) / double(from));
  std::ostringstream line;
  line << "batch size " << from << " -> " << to << " after step " << step_;
  if (c) line << " (" << c->why << ")";
  line << "; lr " << lr << " -> " << opt.lr();
  std::cout << "\n" << line.str() << "\n" << std::flush;
  changes_ += (changes_.empty() ? "" : "; ") + ("step " + std::to_string(step_) + " " +
                                                std::to_string(from) + "->" + std::to_string(to));
}

std::string AutoBatch::take_changes() {
  std::string out;
  out.swap(changes_);
  return out;
}

}  // namespace opforge::cli
