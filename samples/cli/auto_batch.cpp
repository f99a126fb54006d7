#include "auto_batch.hpp"

#include <iostream>
#include <sstream>

namespace opforge::cli {

AutoBatch::AutoBatch(const TrainOptions& o) : start_(o.batch_size) {
  if (!o.batch_auto) return;
  AdaptiveBatchSize::Options ao;
  ao.min = o.batch_min;
  ao.max = o.batch_max;
  control_.emplace(o.batch_size, ao);
}

double AutoBatch::scale() const { return on() ? double(batch()) / double(start_) : 1.0; }

int64_t AutoBatch::batch() const { return on() ? control_->batch() : start_; }

void AutoBatch::after_step(int64_t samples, double seconds, bool memory_pressure,
                           torch::data::DataLoader& loader, torch::optim::Optimizer& opt) {
  if (!on()) return;
  std::optional<AdaptiveBatchSize::Change> c = control_->record(samples, seconds, memory_pressure);
  if (!c) return;
  loader.set_batch_size(c->to);
  const double lr = opt.lr();
  opt.set_lr(lr * double(c->to) / double(c->from));
  std::ostringstream line;
  line << "batch size " << c->from << " -> " << c->to << " after step " << c->step << " (" << c->why
       << "); lr " << lr << " -> " << opt.lr();
  std::cout << "\n" << line.str() << "\n" << std::flush;
  changes_ +=
      (changes_.empty() ? "" : "; ") + ("step " + std::to_string(c->step) + " " +
                                        std::to_string(c->from) + "->" + std::to_string(c->to));
}

std::string AutoBatch::take_changes() {
  std::string out;
  out.swap(changes_);
  return out;
}

}  // namespace opforge::cli
