// opforge::torch::nn: torch.nn's Module tree (named parameters and buffers, children, train/eval,
// state_dict) and the layers training needs, over the op API and autograd. Parameters are leaf
// tensors that require a gradient; a module's member (`weight`) and its registered entry are the
// same handle, so a gradient or a loaded value is seen through both.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opforge/torch/functional.hpp"

namespace opforge::torch::nn {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // The layer's name for messages and printing: "Linear", "Sequential".
  virtual std::string name() const = 0;

  // Dotted names as PyTorch's ("0.weight", "fc1.bias"), in registration order, children after
  // their parent's own.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // Parameters and buffers by dotted name; the tensors are the module's own (not copies).
  std::map<std::string, Tensor> state_dict() const;
  // Copies each entry's values into the module's tensor of that name (under no_grad). strict:
  // a missing or unexpected name is an Error; a shape mismatch always is, naming the entry.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Clears every parameter's gradient (set_to_none) or zeroes it in place.
  void zero_grad(bool set_to_none = true);

 protected:
  // Makes t a leaf that requires a gradient and registers it; returns it (the same handle).
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    check_name(name);
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void check_name(const std::string& name) const;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// y = x W^T + b, initialised as PyTorch does: W and b uniform in +-1/sqrt(in_features)
// (Kaiming-uniform with a = sqrt(5)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::Float32,
         Generator& g = default_generator());
  Tensor forward(const Tensor& x) override { return F::linear(x, weight, bias); }
  std::string name() const override { return "Linear"; }
  Tensor weight, bias;
};

// NCHW convolution, initialised as PyTorch's Conv2d (weight and bias uniform in
// +-1/sqrt(in_channels / groups * kernel_size^2)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
         const Conv2dOptions& options = {}, bool bias = true, DType dtype = DType::Float32,
         Generator& g = default_generator());
  Tensor forward(const Tensor& x) override { return conv2d(x, weight, bias, options_); }
  std::string name() const override { return "Conv2d"; }
  Tensor weight, bias;

 private:
  Conv2dOptions options_;
};

// Transposed convolution (the gradient of a convolution's input), initialised as PyTorch's
// ConvTranspose2d: weight (in_channels, out_channels / groups, k, k), bound
// 1/sqrt(out_channels / groups * k^2).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  const ConvTranspose2dOptions& options = {}, bool bias = true,
                  DType dtype = DType::Float32, Generator& g = default_generator());
  Tensor forward(const Tensor& x) override { return conv_transpose2d(x, weight, bias, options_); }
  std::string name() const override { return "ConvTranspose2d"; }
  Tensor weight, bias;

 private:
  ConvTranspose2dOptions options_;
};

// Layers without parameters: each applies one function.
#define OPFORGE_TORCH_ACTIVATION(Name, call)                  \
  class Name : public Module {                                \
   public:                                                    \
    Tensor forward(const Tensor& x) override { return call; } \
    std::string name() const override { return #Name; }       \
  };
OPFORGE_TORCH_ACTIVATION(ReLU, F::relu(x))
OPFORGE_TORCH_ACTIVATION(GELU, F::gelu(x))
OPFORGE_TORCH_ACTIVATION(Sigmoid, F::sigmoid(x))
OPFORGE_TORCH_ACTIVATION(Tanh, F::tanh(x))
#undef OPFORGE_TORCH_ACTIVATION

class Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1, int end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override { return F::flatten(x, start_, end_); }
  std::string name() const override { return "Flatten"; }

 private:
  int start_, end_;
};

// Under DataParallel a training step draws one seed from the generator on the caller's thread,
// and each sample's mask is a function of that seed and the sample's place in the batch, so the
// masks are the same however the batch is split among devices or into micro-batches.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator& g = default_generator());
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Dropout"; }
  Generator& generator() const { return *g_; }

 private:
  double p_;
  Generator* g_;
};

// Pooling layers: max_pool2d or avg_pool2d with fixed options.
template <Tensor (*Pool)(const Tensor&, const Pool2dOptions&)>
class Pool2d : public Module {
 public:
  explicit Pool2d(const Pool2dOptions& o) : o_(o) {}
  Tensor forward(const Tensor& x) override { return Pool(x, o_); }
  std::string name() const override { return Pool == &max_pool2d ? "MaxPool2d" : "AvgPool2d"; }

 private:
  Pool2dOptions o_;
};
using MaxPool2d = Pool2d<&max_pool2d>;
using AvgPool2d = Pool2d<&avg_pool2d>;

// Batch normalisation of (N, C, H, W) inputs over N, H and W per channel (F::batch_norm), with the
// buffers running_mean (0), running_var (1) and num_batches_tracked, as PyTorch's; weight 1 and
// bias 0 to start with (affine).
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, DType dtype = DType::Float32);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return sync_ ? "SyncBatchNorm" : "BatchNorm2d"; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

  // A part of a batch: its values per channel, and their mean and unbiased variance (the values
  // a call with momentum 1 leaves in the running statistics).
  struct RowStats {
    int64_t count = 0;
    Tensor mean, var;
  };
  // Updates the running statistics once for a batch that ran in parts (DataParallel's shares and
  // micro-batches, each normalised by its own statistics, as torch.nn.DataParallel's replicas
  // are): the parts' statistics merged exactly (Chan et al.), so the running statistics are
  // those of one call on the whole batch.
  void update_running_stats(const std::vector<RowStats>& parts);

 protected:
  Tensor sync_forward(const Tensor& x);  // SyncBatchNorm's (sync_batch_norm.cpp)
  double eps_, momentum_;
  // Normalises over every MPI rank's batch: a SyncBatchNorm, or a BatchNorm2d converted to one.
  bool sync_ = false;
  friend class SyncBatchNorm;
};

// Batch normalisation over the batch of every MPI rank (torch.nn.SyncBatchNorm), for inputs
// (N, C, ...) of two dims or more. In training each rank's per-channel count, sum and sum of
// squares are summed over the ranks (all_reduce_sum, float64), the input is normalised by the
// whole batch's mean and variance, and the running statistics take them (the variance unbiased
// over the whole batch). backward() sums each channel's g and g xhat over the ranks the same way,
// so each rank's input gradient is its part of the whole batch's; the weight's and bias's
// gradients are the rank's own sums, which the gradients' all-reduce then averages as any
// parameter's. Every rank must run the same layers in the same order. In a process mpirun did not
// start, or a build without MPI, it is batch normalisation over the process's batch. Inside a
// DataParallel share it raises an Error (its threads would talk to MPI at once): BatchNorm2d is
// the layer there.
class SyncBatchNorm : public BatchNorm2d {
 public:
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                         bool affine = true, DType dtype = DType::Float32)
      : BatchNorm2d(num_features, eps, momentum, affine, dtype) {
    sync_ = true;
  }
  // torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm2d in module's tree (module
  // itself included) normalises as a SyncBatchNorm from then on, its parameters, buffers and
  // training mode kept. The layers stay the same objects (of C++ type BatchNorm2d, named
  // "SyncBatchNorm"), so a module that calls its layers through members of its own, as C++
  // modules do, runs the converted ones. Returns module.
  static Module& convert_sync_batchnorm(Module& module);
};

// Normalises over the trailing dims; weight 1 and bias 0 to start with (elementwise_affine).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     DType dtype = DType::Float32);
  Tensor forward(const Tensor& x) override { return layer_norm(x, shape_, weight, bias, eps_); }
  std::string name() const override { return "LayerNorm"; }
  Tensor weight, bias;

 private:
  Shape shape_;
  double eps_;
};

// Applies its children in order; they are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> layers);
  void push_back(std::shared_ptr<Module> layer);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
};

// Losses: called with (input, target).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(double label_smoothing = 0, F::Reduction r = F::Reduction::mean)
      : smoothing_(label_smoothing), reduction_(r) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return F::cross_entropy(logits, target, smoothing_, reduction_);
  }

 private:
  double smoothing_;
  F::Reduction reduction_;
};
class MSELoss {
 public:
  explicit MSELoss(F::Reduction r = F::Reduction::mean) : reduction_(r) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return F::mse_loss(input, target, reduction_);
  }

 private:
  F::Reduction reduction_;
};

}  // namespace opforge::torch::nn
