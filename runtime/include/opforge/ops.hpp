// The op API: one function per built-in op, plus family-level entry points that call any
// registered op by name (user ops added with opforge_add_ops go through those). Each call maps
// its arguments onto the family's canonical view and lets the dispatcher pick the kernel.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opforge/tensor.hpp"

namespace opforge {

// An attribute value: the op's attribute spec says whether it is read as a float or an integer.
using AttrValues = std::vector<double>;

// ---- family entry points (any registered op, by name) ----
Tensor elementwise(const std::string& op, const std::vector<Tensor>& inputs,
                   const AttrValues& attrs = {});
// Reduces over `axes` (all when empty). Normalising ops (softmax, layer_norm) take one axis block.
Tensor reduction(const std::string& op, const Tensor& x, std::vector<int> axes, bool keepdims,
                 const AttrValues& attrs = {}, const std::vector<Tensor>& extra = {});

// Every result of an op by name (an op may have several outputs); `outs`, when given, are the
// tensors to write them into, as the _out functions below do.
std::vector<Tensor> elementwise_results(const std::string& op, const std::vector<Tensor>& inputs,
                                        const AttrValues& attrs = {},
                                        const std::vector<Tensor>& outs = {});

// ---- elementwise ----
// Each op also has name_out(out, inputs...) (PyTorch's out=): the result is written into `out`,
// which must have the result's shape and a dtype the result may be cast to (PyTorch's rule: no
// floating result into an integer tensor, nothing but bool into a bool one), and `out` is
// returned. An expanded (stride-0) `out` is refused; an input that overlaps `out` other than as
// the very same view is read completely before anything is written.
// The one-input, attribute-free ops; ops_elementwise.cpp defines them from the same list.
#define OPFORGE_UNARY_OPS(X) \
  X(neg)                     \
  X(abs)                     \
  X(exp)                     \
  X(log)                     \
  X(log1p)                   \
  X(expm1)                   \
  X(sqrt)                    \
  X(rsqrt)                   \
  X(reciprocal)              \
  X(sin)                     \
  X(cos)                     \
  X(tanh)                    \
  X(sigmoid) X(relu) X(gelu) X(softplus) X(erf) X(floor) X(ceil) X(round) X(sign) X(logical_not)
#define OPFORGE_DECLARE_UNARY(name) \
  Tensor name(const Tensor& x);     \
  Tensor name##_out(const Tensor& out, const Tensor& x);
OPFORGE_UNARY_OPS(OPFORGE_DECLARE_UNARY)
#undef OPFORGE_DECLARE_UNARY
Tensor leaky_relu(const Tensor& x, double alpha = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor clip(const Tensor& x, double min, double max);
Tensor clip_out(const Tensor& out, const Tensor& x, double min, double max);

// Two-input ops; each also takes a Python-style number as its second operand.
#define OPFORGE_BINARY_OPS(X) \
  X(add)                      \
  X(sub) X(mul) X(div) X(pow) X(maximum) X(minimum) X(mod) X(eq) X(ne) X(lt) X(le) X(gt) X(ge)
#define OPFORGE_DECLARE_BINARY(name)                                      \
  Tensor name(const Tensor& a, const Tensor& b);                          \
  Tensor name(const Tensor& a, double b);                                 \
  Tensor name##_out(const Tensor& out, const Tensor& a, const Tensor& b); \
  Tensor name##_out(const Tensor& out, const Tensor& a, double b);
OPFORGE_BINARY_OPS(OPFORGE_DECLARE_BINARY)
#undef OPFORGE_DECLARE_BINARY
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& x, DType dtype);
// sin and cos of x in one pass (one kernel with two outputs).
std::pair<Tensor, Tensor> sincos(const Tensor& x);
// y += alpha * x in place (BLAS axpy, one kernel with an inout buffer); x broadcasts to y's shape
// and must have y's dtype (float32 or float64). Returns y.
Tensor axpy_(const Tensor& y, double alpha, const Tensor& x);

// ---- gradients (backward kernels generated from each op's DSL definition) ----
// The gradient of every non-bool input of elementwise op `op` at `inputs`, given `grad`, the
// gradient of its result (of the inputs' broadcast shape): one tensor per non-bool input, of that
// input's shape (summed over the dims it was broadcast along) and dtype. At kinks and ties the
// conventions are PyTorch's (relu'(0) = 0; maximum splits a tie's gradient in half). `needed`
// (PyTorch's output_mask), when given, has one flag per non-bool input: an input whose flag is
// false gets an undefined tensor, and no reduction to its shape.
std::vector<Tensor> elementwise_backward(const std::string& op, const std::vector<Tensor>& inputs,
                                         const Tensor& grad, const AttrValues& attrs = {},
                                         const std::vector<bool>& needed = {});
// x summed down to `shape`, which broadcasts to x's shape (PyTorch's sum_to_size): over the
// leading dims `shape` lacks and the dims where it has 1.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- reductions (axes empty = all) ----
Tensor sum(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor prod(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor logsumexp(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false);
Tensor var(const Tensor& x, const std::vector<int>& axes = {}, bool keepdims = false,
           double ddof = 0);
// argmax/argmin over one axis, or over the flattened tensor when axis is empty.
Tensor argmax(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Tensor argmin(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Tensor softmax(const Tensor& x, int axis = -1);
Tensor log_softmax(const Tensor& x, int axis = -1);
// Each row's cross-entropy of scores (N, C) against target distributions p (N, C): -sum p
// log_softmax(scores), one kernel (`cross_entropy`); the scores' gradient is one kernel too
// (`cross_entropy_backward`). torch::F::cross_entropy builds p from class indices.
Tensor cross_entropy(const Tensor& scores, const Tensor& target_probs);
// Normalises over the trailing dims named by normalized_shape; weight and bias default to 1 and 0.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// PyTorch's batch_norm over x (N, C, ...), per channel: in training the batch's mean and biased
// variance normalise x (one `batch_norm_train` kernel computes both), and running_mean and
// running_var, when given, move towards them by `momentum` (the variance unbiased), in place; in
// evaluation the running statistics normalise x (one `batch_norm` kernel). weight and bias default
// to 1 and 0. One `batch_norm_backward` kernel computes x's, the weight's and the bias's
// gradients.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = true,
                  double momentum = 0.1, double eps = 1e-5);

// ---- contraction ----
// NumPy matmul: 1-D operands are promoted, batch dimensions broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// ONNX/BLAS gemm on 2-D operands: alpha * op(A) op(B) + beta * C, C broadcast to (M, N).
Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& c = {}, double alpha = 1,
            double beta = 1, bool trans_a = false, bool trans_b = false);
// What linear may apply to its result in the same kernel.
enum class Activation { none, relu };
// PyTorch's linear: x (..., in_features) times the weight (out_features, in_features) transposed,
// plus the bias (out_features) if given, then the activation: one kernel (the `linear` op), which
// reads the weight as it is stored.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              Activation activation = Activation::none);

// ---- window (NCHW) ----
struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& o = {});
struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  // 0: the kernel size
  std::array<int64_t, 2> padding{0, 0};
  bool count_include_pad = true;  // avg_pool2d only
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o);
// max_pool2d and, for each window, where its maximum lies in its input plane (int64 h * W + w,
// PyTorch's return_indices=True). Under autograd max_pool2d runs this and its gradient reads the
// indices, as PyTorch's does.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& o);
// PyTorch's max_unpool2d: x (N, C, OH, OW) written into zeros of (N, C, H, W) at `indices` (int64,
// x's shape, into each H * W plane, as max_pool2d_with_indices gives them); H, W from the pool's
// options ((OH - 1) * stride - 2 * padding + kernel), or output_size (within a stride of that).
// An index outside its plane is an Error. Where two windows name one point (overlapping windows),
// their values are summed (PyTorch keeps one of them). Differentiable in x.
Tensor max_unpool2d(const Tensor& x, const Tensor& indices, const Pool2dOptions& o,
                    std::optional<std::array<int64_t, 2>> output_size = std::nullopt);
// PyTorch's conv_transpose2d: weight (in_channels, out_channels/groups, kH, kW); the output is
// (N, out_channels, (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1,
// ...).
struct ConvTranspose2dOptions : Conv2dOptions {
  std::array<int64_t, 2> output_padding{0, 0};  // smaller than the stride
};
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                        const ConvTranspose2dOptions& o = {});
// The gradients of the window ops, each a generated op of its own (autograd calls them): of
// conv2d's input (a transposed convolution of the output's gradient; input_shape is the input's
// NCHW shape) and weight (weight_shape: (out_channels, in_channels/groups, kH, kW)), and of a
// pool's input, given that input and the gradient of the pool's output (max_pool2d_backward finds
// each window's maximum with max_pool2d_with_indices, then runs the gradient kernel on them).
Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& o = {});
Tensor conv2d_backward_weight(const Tensor& x, const Tensor& grad, const Shape& weight_shape,
                              const Conv2dOptions& o = {});
Tensor max_pool2d_backward(const Tensor& x, const Tensor& grad, const Pool2dOptions& o);
Tensor avg_pool2d_backward(const Tensor& x, const Tensor& grad, const Pool2dOptions& o);

// ---- optimiser steps: one generated kernel updates a parameter and its state in place ----
// PyTorch's update rules (torch.optim.SGD, Adam, AdamW) for one parameter: every state tensor has
// the parameter's shape and dtype (a floating one); the gradient has its shape. Run without
// recording, as torch.optim's steps run under no_grad.
// param -= lr * (grad + weight_decay * param)
void sgd_step_(const Tensor& param, const Tensor& grad, double lr, double weight_decay = 0);
// With a momentum buffer: on the first step (first_step) the buffer becomes d = grad +
// weight_decay * param, afterwards momentum * buffer + (1 - dampening) * d; the parameter moves by
// -lr times the buffer, or with Nesterov by -lr * (d + momentum * buffer).
void sgd_momentum_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                        double lr, double momentum, double dampening, double weight_decay,
                        bool nesterov, bool first_step);
// Adam (decoupled_weight_decay false) or AdamW (true) at step `step` (1 for the first), with its
// two moments.
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, bool decoupled_weight_decay, int64_t step);

// ---- movement ----
Tensor concat(const std::vector<Tensor>& xs, int axis = 0);
// pads[d] = {before, after} for each dim, from the first.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value = 0);
Tensor index_select(const Tensor& x, int axis, const Tensor& index);
// PyTorch's index_add: x with alpha * source's slices added at `index` along `axis` (indices may
// repeat; every one adds). source has x's shape with index's length along `axis`. One kernel; it
// is index_select's gradient, and index_select is its source's.
Tensor index_add(const Tensor& x, int axis, const Tensor& index, const Tensor& source,
                 double alpha = 1);
Tensor gather(const Tensor& x, int axis, const Tensor& index);  // NumPy take along one axis
// Writes src into dst (a view), broadcasting src and converting it to dst's dtype.
void copy_into(const Tensor& dst, const Tensor& src);

}  // namespace opforge
