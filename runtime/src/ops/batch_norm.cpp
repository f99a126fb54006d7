// batch_norm and its gradients on the reduction family's batch_norm kernels: in training one kernel
// computes the batch's statistics and the normalised tensor, in evaluation one normalises with the
// running statistics, and one computes all three gradients. x (N, C, ...) is the view (inner, C, N)
// with inner the product of the dims after C, so nothing is copied; the per-channel statistics and
// sums are reduced over inner and N.
#include "autograd/record.hpp"
#include "kernels/kernel_call.hpp"
#include "ops/reduction_call.hpp"

namespace opforge {
namespace {
using namespace detail;

// x's, the weight's and the bias's gradients, given g (the result's gradient), in one kernel. In
// training the statistics depend on x: dx takes the sums of g and g xhat over each channel;
// through fixed (running) statistics it is weight rstd g.
std::vector<Tensor> batch_norm_grads(const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& var, const Tensor& g, bool training, double eps,
                                     bool need_x, bool need_w, bool need_b) {
  std::vector<Tensor> r = run_per_channel(OPFORGE_OP("batch_norm_backward"), x, {g}, {mean, var, w},
                                          {eps, training ? 1.0 : 0.0});
  return {need_x ? r[0] : Tensor(), need_w ? r[1] : Tensor(), need_b ? r[2] : Tensor()};
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  OPFORGE_CHECK(x.defined() && x.dim() >= 2) << "batch_norm: expected an (N, C, ...) input, got "
                                             << (x.defined() ? shape_str(x.shape()) : "undefined");
  OPFORGE_CHECK(is_floating(x.dtype()))
      << "batch_norm: expected a float32 or float64 input, got " << dtype_name(x.dtype());
  const int64_t C = x.size(1);
  OPFORGE_CHECK(running_mean.defined() == running_var.defined())
      << "batch_norm: running_mean and running_var come together (both or neither)";
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias})
    OPFORGE_CHECK(!t->defined() || t->shape() == Shape{C})
        << "batch_norm: a statistic or affine parameter of shape " << shape_str(t->shape())
        << ", expected (" << C << ") for the input's " << C << " channels";
  OPFORGE_CHECK(training || running_mean.defined())
      << "batch_norm: evaluation needs running_mean and running_var";
  const int64_t n = C == 0 ? 0 : x.numel() / C;
  OPFORGE_CHECK(!training || n > 1)
      << "batch_norm: training needs more than one value per channel, got " << shape_str(x.shape());
  Tensor w = weight.defined() ? weight.to(x.dtype()) : Tensor::ones({C}, x.dtype());
  Tensor b = bias.defined() ? bias.to(x.dtype()) : Tensor::zeros({C}, x.dtype());
  Tensor mean, var;
  if (!training) {
    mean = running_mean.to(x.dtype());
    var = running_var.to(x.dtype());
  }
  auto forward = [&] {
    if (!training)
      return run_reduction(OPFORGE_OP("batch_norm"), x, {1}, true, {eps}, {mean, var, w, b});
    std::vector<Tensor> r =
        run_per_channel(OPFORGE_OP("batch_norm_train"), x.detach(), {}, {w, b}, {eps});
    mean = r[1];
    var = r[2];
    if (running_mean.defined()) {
      autograd::NoGradGuard no_grad;
      Tensor rm = running_mean, rv = running_var;  // handles on the same storage
      rm.mul_(1 - momentum).add_(mean.to(rm.dtype()), momentum);
      rv.mul_(1 - momentum).add_(mul(var, double(n) / double(n - 1)).to(rv.dtype()), momentum);
    }
    return r[0];
  };
  return autograd::differentiable("batch_norm", {x, weight, bias}, forward, [&](const Tensor&) {
    return [sx = autograd::SavedTensor(x), sw = autograd::SavedTensor(w),
            smean = autograd::SavedTensor(mean), svar = autograd::SavedTensor(var), training, eps,
            need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
            need_b = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& g) {
      return batch_norm_grads(sx.unpack("batch_norm"), sw.unpack("batch_norm"),
                              smean.unpack("batch_norm"), svar.unpack("batch_norm"), g[0], training,
                              eps, need_x, need_w, need_b);
    };
  });
}

}  // namespace opforge
