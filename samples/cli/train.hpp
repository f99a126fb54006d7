// `opforge train` and `opforge eval`: the main job. Trains a model on Fashion-MNIST with the
// PyTorch-style API (opforge::torch), showing progress, and writes a run folder (weights,
// metrics per epoch, a plot); evaluates saved weights with a confusion matrix.
#pragma once
#include <cstdint>
#include <string>

namespace opforge::cli {

struct TrainOptions {
  std::string model = "mlp";                       // mlp (784-512-256-10, ReLU) or cnn
  int64_t epochs = 5, batch_size = 64, limit = 0;  // limit > 0: the first `limit` training samples
  std::string optimizer = "sgd";                   // sgd (momentum 0.9), adam, adamw
  double lr = 0;                                   // 0: the optimiser's default here
  std::string lr_schedule = "cosine";              // none, cosine (to 0 over the epochs), step
  double label_smoothing = 0;
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
  std::string device = "auto";
  std::string data;  // empty: the Debian package's folder
  std::string out;   // empty: runs/<model>-<date>-<time>
};
int run_train(const TrainOptions& o);

// Training speed and where a step's time goes: `steps` steps of run_train's loop after `warmup`,
// on the first images of the training set (`opforge bench --train`, against PyTorch's).
struct TrainTiming {
  double samples_per_second = 0;
  // Milliseconds per step: waiting for the batch, forward pass and loss, backward pass, and the
  // optimiser's step with zero_grad.
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
};
TrainTiming time_training(const TrainOptions& o, int64_t steps, int64_t warmup);

struct EvalOptions {
  std::string weights, data;
  int64_t batch_size = 1000;
};
int run_eval(const EvalOptions& o);

}  // namespace opforge::cli
