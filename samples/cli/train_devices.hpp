// Where `opforge train` runs its steps: the devices of --devices (data-parallel, nn::DataParallel)
// or one module whose calls are placed one by one (or pinned with --device), and the logical CPU
// devices --devices asks for.
#pragma once
#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "opforge/torch.hpp"
#include "opforge/torch/data.hpp"
#include "opforge/torch/distributed.hpp"
#include "train.hpp"

namespace opforge::cli {

// The devices of --devices: a comma-separated list, or auto: every device that runs kernels but
// those automatic placement leaves out (an OpenCL device on the host's own cores).
std::vector<Device> device_list(const std::string& list);
// Each name's count as a fraction of them all.
std::vector<std::pair<std::string, double>> shares_of(
    const std::vector<std::pair<std::string, int64_t>>& counts);
// "cpu:0 61.5% cpu:1 38.5%".
std::string percent_str(const std::vector<std::pair<std::string, double>>& shares);
std::vector<std::pair<std::string, int64_t>> named(const std::vector<Device>& devs,
                                                   const std::vector<int64_t>& samples);
// Each device's share of the samples, as percent_str gives it.
std::string split_str(const std::vector<Device>& devs, const std::vector<int64_t>& samples);

// The model's training step on a batch: over the devices of --devices (DataParallel), or the
// whole batch at once, its calls placed one by one (or on --device).
class Stepper {
 public:
  Stepper(const TrainOptions& o, std::shared_ptr<torch::nn::Module> net)
      : net_(std::move(net)), criterion_(o.label_smoothing) {
    std::vector<Device> devs = o.devices.empty() ? std::vector<Device>{} : device_list(o.devices);
    if (devs.size() > 1) {
      ThroughputSplit::Options so;
      so.fixed = o.fixed_split;
      parallel_ = std::make_unique<torch::nn::DataParallel>(net_, devs, so);
      all_ = devs;
      samples_.assign(devs.size(), 0);
      seconds_.assign(devs.size(), 0);
    } else if (devs.size() == 1) {
      scope_ = std::make_unique<DefaultDevice>(devs[0]);
    } else if (o.device != "auto") {
      scope_ = std::make_unique<DefaultDevice>(o.device);
    }
  }
  // Forward and backward; returns the loss.
  Tensor step(const Tensor& x, const Tensor& y) {
    if (!parallel_) {
      Tensor loss = criterion_((*net_)(x), y);
      loss.backward();
      return loss;
    }
    Tensor loss = parallel_->forward_backward(
        x, y, [this](const Tensor& out, const Tensor& t) { return criterion_(out, t); });
    // Counted by device, among all of --devices: one may leave the split (it failed) and return.
    const std::vector<Device>& now = parallel_->devices();
    for (size_t i = 0; i < now.size(); i++) {
      const size_t k = size_t(std::find(all_.begin(), all_.end(), now[i]) - all_.begin());
      samples_[k] += parallel_->last_split()[i];
      seconds_[k] += parallel_->last_seconds()[i];
    }
    steps_++;
    return loss;
  }
  bool parallel() const { return parallel_ != nullptr; }
  std::string device_names() const {
    std::ostringstream os;
    for (const Device& d : parallel_->devices()) os << (os.tellp() > 0 ? ", " : "") << d.str();
    return os.str();
  }
  // The last step's split, and the samples each device ran since reset().
  std::string last_split() const {
    return parallel_ ? split_str(parallel_->devices(), parallel_->last_split()) + micro_batches()
                     : "";
  }
  // "cpu:1 16": the devices that run their share in micro-batches (out of memory), and their size.
  std::string micro_batch_list() const {
    if (!parallel_) return "";
    std::ostringstream os;
    std::vector<int64_t> m = parallel_->micro_batch_sizes();
    for (size_t i = 0; i < m.size(); i++)
      if (m[i] > 0)
        os << (os.tellp() > 0 ? " " : "") << parallel_->devices()[i].str() << " " << m[i];
    return os.str();
  }
  // A device short of memory in the last step: a share that ran out (and went on in smaller
  // micro-batches), or a device with 95% of its memory in use (where the driver says).
  bool memory_short() const {
    if (parallel_ && parallel_->ran_out_of_memory()) return true;
    const std::vector<Device> devs =
        parallel_ ? parallel_->devices() : std::vector<Device>{default_device()};
    for (const Device& d : devs) {
      try {
        if (percent_used_mem_on_dev(d) >= 95) return true;
      } catch (const Error&) {  // a driver that reports no memory: nothing to go by
      }
    }
    return false;
  }
  std::string micro_batches() const {
    std::string list = micro_batch_list();
    return list.empty() ? list : std::string(", micro-batches ").append(list);
  }
  std::string split_since_reset() const { return parallel_ ? split_str(all_, samples_) : ""; }
  std::vector<std::pair<std::string, double>> shares_since_reset() const {
    if (!parallel_) return {};
    return shares_of(named(all_, samples_));
  }
  // Each device's (of --devices) mean milliseconds per step for its share since reset().
  std::vector<double> share_ms_since_reset() const {
    std::vector<double> out;
    for (double sec : seconds_) out.push_back(1e3 * sec / double(std::max<int64_t>(steps_, 1)));
    return out;
  }
  void reset() {
    std::fill(samples_.begin(), samples_.end(), 0);
    std::fill(seconds_.begin(), seconds_.end(), 0.0);
    steps_ = 0;
  }

 private:
  std::shared_ptr<torch::nn::Module> net_;
  torch::nn::CrossEntropyLoss criterion_;
  std::unique_ptr<torch::nn::DataParallel> parallel_;
  std::unique_ptr<DefaultDevice> scope_;
  std::vector<Device> all_;  // --devices, in order
  std::vector<int64_t> samples_;
  std::vector<double> seconds_;
  int64_t steps_ = 0;
};

// --distributed: this process as one of mpirun's ranks, each training on its part of every batch,
// the gradients averaged as the backward pass produces them; without it a world of one.
struct Ranks {
  int rank = 0, world = 1;
  std::unique_ptr<torch::distributed::GradientReducer> reducer;
  // Starts MPI, checks that the batch divides by the ranks, broadcasts rank 0's parameters and
  // refuses ranks whose model, data size (`samples`) or batch size differ.
  Ranks(const TrainOptions& o, torch::nn::Module& net, int64_t samples);
  bool lead() const { return rank == 0; }
  void shard(torch::data::DataLoader& loader) const {
    if (world > 1) loader.shard(rank, world);
  }
  // After the backward pass: the gradients' means over the ranks.
  void finish_gradients() {
    if (reducer) reducer->finish();
  }
};

}  // namespace opforge::cli
