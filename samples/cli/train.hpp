// `opforge train` and `opforge eval`: the main job. Trains a model on Fashion-MNIST with the
// PyTorch-style API (opforge::torch), showing progress, and writes a run folder (weights,
// metrics per epoch, a plot); evaluates saved weights with a confusion matrix.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opforge/torch/nn.hpp"

namespace opforge::cli {

struct TrainOptions {
  std::string model = "mlp";                       // mlp (784-512-256-10, ReLU) or cnn
  int64_t epochs = 5, batch_size = 64, limit = 0;  // limit > 0: the first `limit` training samples
  // --batch-size auto: batch_size is where the batch starts, and the rate is for it.
  bool batch_auto = false;
  int64_t batch_min = 16, batch_max = 1024;
  std::string optimizer = "sgd";       // sgd (momentum 0.9), adam, adamw
  double lr = 0;                       // 0: the optimiser's default here
  std::string lr_schedule = "cosine";  // none, cosine (to 0 over the epochs), step
  double label_smoothing = 0;
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
  std::string device = "auto";
  // Data-parallel training (nn::DataParallel): each step's batch split over these devices in
  // proportion to their measured speed, a comma-separated list ("cpu:0,cpu:1,opencl:0") or auto
  // (every device automatic placement uses); empty: one module, its calls placed one by one.
  std::string devices;
  bool fixed_split = false;  // the batch split by cores instead (a benchmark's baseline)
  // One rank of mpirun's: --batch-size is then all ranks' batch, each rank training on its part.
  bool distributed = false;
  std::string data;  // empty: the Debian package's folder
  std::string out;   // empty: runs/<model>-<date>-<time>
  // Checkpoints (checkpoint.hpp): written at every epoch's end and every checkpoint_every steps
  // (0: epochs only); resume: a run folder to go on from; max_steps: stop after that many steps
  // in this process (0: none), leaving a checkpoint to resume from.
  int64_t checkpoint_every = 0, max_steps = 0;
  std::string resume;
};
int run_train(const TrainOptions& o);
// opforge train's models by name: mlp (784-512-256-10, ReLU) or cnn; an Error for another name.
std::shared_ptr<torch::nn::Module> make_model(const std::string& name, Generator& g);
// Before the runtime starts: when --devices names logical CPU devices (cpu:1, ...) and
// OPFORGE_CPU_DEVICES is unset, sets it to split the cores evenly among them. Returns the
// setting it made (empty: none).
std::string split_cores_for(const std::string& devices);

// Training speed and where a step's time goes: `steps` steps of run_train's loop after `warmup`,
// on the first images of the training set (`opforge bench --train`, against PyTorch's).
struct TrainTiming {
  double samples_per_second = 0;
  // Milliseconds per step: waiting for the batch, forward pass and loss, backward pass, and the
  // optimiser's step with zero_grad.
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  // Distributed: the part of backward_ms after the backward pass, waiting for the ranks' sums.
  double reduce_ms = 0;
  // Data-parallel: each device's share of the samples (the forward and backward passes of the
  // shares overlap, so their time is all in forward_ms).
  std::vector<std::pair<std::string, double>> split;
  std::vector<double> share_ms;  // each device's milliseconds per step for its share
};
TrainTiming time_training(const TrainOptions& o, int64_t steps, int64_t warmup);

struct EvalOptions {
  std::string weights, data;
  int64_t batch_size = 1000;
};
int run_eval(const EvalOptions& o);

}  // namespace opforge::cli
