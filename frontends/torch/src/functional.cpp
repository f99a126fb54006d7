// torch.nn.functional over the op API: the losses are recorded ops or compositions of them, so
// their gradients come from autograd (cross_entropy's kernel, log_softmax's and the elementwise
// ops' backward kernels).
#include "opforge/torch/functional.hpp"

#include <algorithm>

#include "opforge/autograd.hpp"

namespace opforge::torch::functional {
namespace {
Tensor reduce(const Tensor& per_sample, Reduction r) {
  switch (r) {
    case Reduction::mean:
      return mean(per_sample);
    case Reduction::sum:
      return sum(per_sample);
    case Reduction::none:
      break;
  }
  return per_sample;
}

// The checks nll_loss and cross_entropy share: (N, C) scores and N class indices in range.
void check_classes(const char* op, const Tensor& scores, const Tensor& target) {
  OPFORGE_CHECK(scores.defined() && target.defined()) << op << ": an input is undefined";
  OPFORGE_CHECK(scores.dim() == 2)
      << op << ": expected (N, C) scores, got shape " << shape_str(scores.shape());
  OPFORGE_CHECK(is_floating(scores.dtype()))
      << op << ": scores must be float32 or float64, got " << dtype_name(scores.dtype());
  OPFORGE_CHECK(target.dim() == 1 && target.size(0) == scores.size(0))
      << op << ": expected " << scores.size(0) << " class indices (shape (N)), got shape "
      << shape_str(target.shape());
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return opforge::linear(x, weight, bias);
}

Tensor flatten(const Tensor& x, int start_dim, int end_dim) {
  OPFORGE_CHECK(x.defined()) << "flatten: input is undefined";
  if (x.dim() == 0) return x.reshape({1});
  int s = start_dim < 0 ? start_dim + x.dim() : start_dim;
  int e = end_dim < 0 ? end_dim + x.dim() : end_dim;
  OPFORGE_CHECK(s >= 0 && e < x.dim() && s <= e)
      << "flatten: dims " << start_dim << ".." << end_dim << " are not a range of a rank "
      << x.dim() << " tensor";
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  shape.push_back(-1);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return x.reshape(shape);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& g) {
  OPFORGE_CHECK(x.defined()) << "dropout: input is undefined";
  OPFORGE_CHECK(p >= 0 && p <= 1) << "dropout: probability " << p << " is not in [0, 1]";
  if (!training || p == 0) return x;
  if (p == 1) return mul(x, 0.0);
  Tensor keep = cast(ge(Tensor::rand(x.shape(), x.dtype(), g), p), x.dtype());
  return mul(x, mul(keep, 1 / (1 - p)));
}

Tensor one_hot(const Tensor& target, int64_t num_classes, DType dtype) {
  OPFORGE_CHECK(target.defined()) << "one_hot: target is undefined";
  OPFORGE_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32)
      << "one_hot: class indices must be int32 or int64, got " << dtype_name(target.dtype());
  OPFORGE_CHECK(num_classes > 0) << "one_hot: num_classes must be positive, got " << num_classes;
  if (target.numel() > 0) {
    double lo = opforge::min(target).item(), hi = opforge::max(target).item();
    OPFORGE_CHECK(lo >= 0 && hi < double(num_classes))
        << "one_hot: class indices must be in [0, " << num_classes << "), got values in [" << lo
        << ", " << hi << "]";
  }
  Tensor classes = Tensor::arange(0, double(num_classes), 1, DType::Int64);
  return cast(eq(target.to(DType::Int64).unsqueeze(-1), classes), dtype);
}

// Each sample's score at its class, chosen (not multiplied by a one-hot: a -inf score elsewhere
// would make 0 * -inf a NaN).
Tensor at_class(const Tensor& scores, const Tensor& target) {
  Tensor mask = cast(one_hot(target, scores.size(1), DType::Int64), DType::Bool);
  return sum(where(mask, scores, Tensor::scalar(0, scores.dtype())), {1});
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction) {
  check_classes("nll_loss", log_probs, target);
  return reduce(neg(at_class(log_probs, target)), reduction);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     Reduction reduction) {
  OPFORGE_CHECK(label_smoothing >= 0 && label_smoothing <= 1)
      << "cross_entropy: label_smoothing " << label_smoothing << " is not in [0, 1]";
  OPFORGE_CHECK(logits.defined() && target.defined()) << "cross_entropy: an input is undefined";
  // Class probabilities (N, C), as PyTorch takes them too, or class indices (N).
  Tensor probs;
  if (is_floating(target.dtype()) && target.dim() == 2) {
    OPFORGE_CHECK(target.shape() == logits.shape())
        << "cross_entropy: class probabilities of shape " << shape_str(target.shape())
        << ", expected the scores' " << shape_str(logits.shape());
    probs = target;
  } else {
    check_classes("cross_entropy", logits, target);
    probs = one_hot(target, logits.size(1), logits.dtype());
  }
  // The target distribution is (1 - e) of it plus e / C on every class.
  if (label_smoothing > 0)
    probs = add(mul(probs, 1 - label_smoothing), label_smoothing / double(logits.size(1)));
  return reduce(opforge::cross_entropy(logits, probs), reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  OPFORGE_CHECK(input.defined() && target.defined()) << "mse_loss: an input is undefined";
  OPFORGE_CHECK(input.shape() == target.shape())
      << "mse_loss: input of shape " << shape_str(input.shape()) << " and target of shape "
      << shape_str(target.shape()) << " differ";
  Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction);
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return opforge::batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps);
}

}  // namespace opforge::torch::functional
