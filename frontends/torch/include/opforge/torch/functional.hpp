// opforge::torch::functional: torch.nn.functional's names and semantics over the op API. Every
// function records for autograd through the ops it is made of.
#pragma once
#include "opforge/ops.hpp"

namespace opforge::torch::functional {

// How a loss reduces over the batch (PyTorch's `reduction=`).
enum class Reduction { mean, sum, none };

inline Tensor relu(const Tensor& x) { return opforge::relu(x); }
inline Tensor gelu(const Tensor& x) { return opforge::gelu(x); }
inline Tensor sigmoid(const Tensor& x) { return opforge::sigmoid(x); }
inline Tensor tanh(const Tensor& x) { return opforge::tanh(x); }
inline Tensor softmax(const Tensor& x, int dim) { return opforge::softmax(x, dim); }
inline Tensor log_softmax(const Tensor& x, int dim) { return opforge::log_softmax(x, dim); }

// The window ops under torch.nn.functional's names (NCHW; options as opforge's ops take them).
inline Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                     const Conv2dOptions& o = {}) {
  return opforge::conv2d(x, weight, bias, o);
}
inline Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                               const ConvTranspose2dOptions& o = {}) {
  return opforge::conv_transpose2d(x, weight, bias, o);
}
inline Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  return opforge::max_pool2d(x, o);
}
inline std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& o) {
  return opforge::max_pool2d_with_indices(x, o);
}
inline Tensor max_unpool2d(const Tensor& x, const Tensor& indices, const Pool2dOptions& o,
                           std::optional<std::array<int64_t, 2>> output_size = std::nullopt) {
  return opforge::max_unpool2d(x, indices, o, output_size);
}
inline Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  return opforge::avg_pool2d(x, o);
}

// x @ weight^T + bias; weight is (out_features, in_features), bias (out_features) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// Dims start_dim..end_dim as one.
Tensor flatten(const Tensor& x, int start_dim = 1, int end_dim = -1);

// Zeroes each element with probability p and scales the others by 1 / (1 - p) when training;
// x itself otherwise.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true,
               Generator& g = default_generator());

// (N) class indices in [0, num_classes) as an (N, num_classes) tensor of 0 and 1 in `dtype`.
Tensor one_hot(const Tensor& target, int64_t num_classes, DType dtype = DType::Int64);

// log_probs (N, C) and class indices (N): -log_probs[i, target[i]], reduced.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::mean);
// -sum p log_softmax(logits) per sample, one kernel forward and one backward (opforge::
// cross_entropy), against class indices (N) or class probabilities (N, C) as PyTorch takes them,
// with PyTorch's label smoothing: the target distribution is (1 - label_smoothing) of the target
// plus label_smoothing / C on every class.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0,
                     Reduction reduction = Reduction::mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

// Batch normalisation over dim 1 of an (N, C, ...) input (torch.nn.functional.batch_norm). In
// training the batch's mean and biased variance normalise it, and running_mean/running_var (when
// defined) move towards the batch's mean and unbiased variance by `momentum`, in place; otherwise
// the running statistics normalise it. weight and bias (C) are optional.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                  double momentum = 0.1, double eps = 1e-5);

}  // namespace opforge::torch::functional

namespace opforge::torch {
namespace F = functional;
}
