// Data-parallel training over the devices of one process: each step's batch is split among the
// devices in proportion to their measured throughput (opforge/batch_split.hpp), each device runs
// the forward and backward pass of its share on a thread of its own, and the gradients are summed
// into the module's parameters. The parameters are the module's own: devices whose tensors live
// in host memory (the logical CPU devices) read them in place, GPU devices keep copies that the
// storage refreshes after each optimiser step, so the replicas cannot drift apart.
//
// Layers with training-mode state: Dropout's masks are drawn per sample from one seed per step
// (the same masks however the batch is split); BatchNorm2d normalises each share (and micro-batch)
// by its own statistics, as torch.nn.DataParallel's replicas and DistributedDataParallel without
// SyncBatchNorm do, and its running statistics are updated once a step with the whole batch's.
// Other layers with buffers are refused in training mode.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opforge/batch_split.hpp"
#include "opforge/device.hpp"
#include "opforge/torch/nn.hpp"

namespace opforge::torch::nn {

class ShareThreads;

// Unlike torch.nn.DataParallel, whose backward runs through the autograd engine's device threads,
// each device here runs its share's backward on its own thread in forward_backward(); forward()
// alone serves evaluation.
class DataParallel {
 public:
  // A loss that reduces by mean over its share (CrossEntropyLoss, MSELoss with the default
  // reduction): the shares' losses, weighted by their sizes, add up to the whole batch's.
  using Criterion = std::function<Tensor(const Tensor& output, const Tensor& target)>;

  // Devices in the order their gradients are summed (so a run is reproducible); each must exist
  // and appear once. Devices start with shares in proportion to their cores (CPU) or equal.
  DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices,
               ThroughputSplit::Options options = {});

  // One step's forward and backward pass: input and target split along dim 0, each device's
  // share on its thread, its loss scaled by its share of the batch; every parameter's gradient
  // summed over the devices and added into its grad(), as backward() would (a device short of
  // memory runs its share in micro-batches, below). Returns the batch's loss (detached).
  // A share that fails runs again on a device whose share succeeded: if it passes there, the
  // failed device leaves the split with a warning (dropped()) and the run goes on; if not, the
  // error is raised naming the device, and no gradient is added. A device that left returns to
  // the split after rejoin_after() steps (twice as many each time it fails again), if it still
  // exists, with the smallest share; failing again, it leaves again.
  Tensor forward_backward(const Tensor& input, const Tensor& target, const Criterion& criterion);

  // The module on each device's share, the outputs concatenated along dim 0 on the host.
  Tensor forward(const Tensor& input);

  Module& module() { return *module_; }
  const std::vector<Device>& devices() const { return devices_; }
  // The samples each device ran in the last step and the seconds it took.
  const std::vector<int64_t>& last_split() const { return last_split_; }
  const std::vector<double>& last_seconds() const { return last_seconds_; }
  const ThroughputSplit& throughput() const { return split_; }
  // Samples per micro-batch on each device; 0: its whole share at once. A share that runs out of
  // memory (OutOfMemoryError: a GPU's memory, or a cap set with set_memory_fraction) is run again
  // in micro-batches of half the size, as often as needed, their gradients added up: the step's
  // result is the same. After `wait` steps without running out (8 at first, twice as many after a
  // failed try) the micro-batch doubles, up to the whole share.
  std::vector<int64_t> micro_batch_sizes() const;
  // Whether a share ran out of memory in the last step (and went on in smaller micro-batches).
  bool ran_out_of_memory() const { return ran_out_; }
  // The devices out of the split now (they failed), with their errors.
  const std::vector<std::pair<Device, std::string>>& dropped() const { return dropped_; }
  // Steps before a device that failed first tries again (50 to start with); 0: never.
  void rejoin_after(int64_t steps);

 private:
  struct MicroBatch {
    int64_t size = 0;
    int calm = 0, wait = 8;
    bool grew = false;
    void after_step(int64_t share, bool ran_out);
  };
  // A device out of the split: its place in the constructor's list, the step it left at, the
  // last step it stays out of, its rate when it left.
  struct Away {
    size_t place;
    int64_t left_at, back_after;
    double rate;
  };
  void check_module() const;
  void drop(size_t i, const std::string& why);
  // The threads of the shares beyond the first, kept between steps (share_threads.hpp).
  std::shared_ptr<ShareThreads> threads_;
  void rejoin();
  std::shared_ptr<Module> module_;
  std::vector<Device> devices_;
  ThroughputSplit split_;
  std::vector<int64_t> last_split_;
  std::vector<double> last_seconds_;
  std::vector<MicroBatch> micro_;
  std::vector<std::pair<Device, std::string>> dropped_;
  std::vector<size_t> places_;         // each device's place in the constructor's list
  std::vector<Away> away_;             // beside dropped_
  std::vector<int64_t> waits_;         // by place: the steps away after the device's next failure
  std::vector<double> initial_rates_;  // by place
  bool fixed_split_ = false;
  bool ran_out_ = false;
  int64_t steps_ = 0, rejoin_after_ = 50;
};

}  // namespace opforge::torch::nn
