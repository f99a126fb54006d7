// SyncBatchNorm: batch normalisation whose statistics, and whose gradient's per-channel sums, are
// summed over the MPI ranks.
#include <algorithm>
#include <cmath>

#include "opforge/autograd.hpp"
#include "opforge/torch/distributed.hpp"
#include "opforge/torch/nn.hpp"
#include "share_state.hpp"

namespace opforge::torch::nn {
namespace {

// x's axes other than the channels' (1).
std::vector<int> stat_axes(const Tensor& x) {
  std::vector<int> axes{0};
  for (int d = 2; d < x.dim(); d++) axes.push_back(d);
  return axes;
}

// A per-channel vector of C values as (1, C, 1, ...), to broadcast over x.
Tensor along_channels(const std::vector<double>& v, const Tensor& x) {
  Shape s(size_t(x.dim()), 1);
  s[1] = int64_t(v.size());
  return Tensor::from_vector(v).to(x.dtype()).reshape(s);
}

// Sums each tensor's elements over the ranks, in float64, and returns them in order, flattened.
std::vector<double> summed_over_ranks(const std::vector<Tensor>& parts) {
  std::vector<Tensor> flat;
  for (const Tensor& t : parts) flat.push_back(t.reshape({-1}).to(DType::Float64));
  Tensor all = concat(flat, 0).contiguous();
  distributed::all_reduce_sum({all});
  return all.to_double_vector();
}

}  // namespace

Module& SyncBatchNorm::convert_sync_batchnorm(Module& module) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&module)) bn->sync_ = true;
  for (const auto& [name, child] : module.named_children()) convert_sync_batchnorm(*child);
  return module;
}

Tensor BatchNorm2d::sync_forward(const Tensor& x) {
  OPFORGE_CHECK(x.defined() && x.dim() >= 2) << "SyncBatchNorm: expected an (N, C, ...) input, got "
                                             << (x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t C = running_mean.defined() ? running_mean.numel() : 0;
  OPFORGE_CHECK(running_mean.defined() && x.size(1) == C)
      << "SyncBatchNorm: an input of " << x.size(1) << " channels, expected " << C;
  OPFORGE_CHECK(is_floating(x.dtype()))
      << "SyncBatchNorm: expected a float32 or float64 input, got " << dtype_name(x.dtype());
  if (!is_training())
    return F::batch_norm(x, running_mean, running_var, weight, bias, false, momentum_, eps_);
  OPFORGE_CHECK(!current_share())
      << "SyncBatchNorm: called inside a DataParallel share, whose threads would all talk to MPI "
         "at once; use BatchNorm2d in a module that DataParallel splits";
  if (!distributed::available() || !distributed::launched()) {
    {
      autograd::NoGradGuard no_grad;
      num_batches_tracked.add_(1.0);
    }
    return F::batch_norm(x, running_mean, running_var, weight, bias, true, momentum_, eps_);
  }
  distributed::init();
  const std::vector<int> axes = stat_axes(x);
  const size_t c = size_t(C);
  std::vector<double> mean(c), var(c);
  double n = 0;
  {
    autograd::NoGradGuard no_grad;
    // This rank's count, sums and sums of squares per channel, the squares from its own mean and
    // variance (n (var + mean^2)), all in float64: the whole batch's variance is then
    // E[x^2] - mean^2, exact to float64 rounding unless a channel's mean is many orders of
    // magnitude above its spread.
    const Tensor xd = x.detach();
    const double count = double(x.numel() / std::max<int64_t>(C, 1));
    const Tensor m = opforge::mean(xd, axes), v = opforge::var(xd, axes, false, 0.0);
    const std::vector<double> s = summed_over_ranks(
        {Tensor::full({1}, count, DType::Float64), mul(m.to(DType::Float64), count),
         mul(add(v.to(DType::Float64), mul(m.to(DType::Float64), m.to(DType::Float64))), count)});
    n = s[0];
    OPFORGE_CHECK(n > 1) << "SyncBatchNorm: training needs more than one value per channel over "
                            "all ranks, got "
                         << n;
    for (size_t k = 0; k < c; k++) {
      mean[k] = s[1 + k] / n;
      var[k] = std::max(0.0, s[1 + c + k] / n - mean[k] * mean[k]);
    }
    std::vector<double> unbiased(c);
    for (size_t k = 0; k < c; k++) unbiased[k] = var[k] * n / (n - 1);
    running_mean.mul_(1 - momentum_)
        .add_(Tensor::from_vector(mean).to(running_mean.dtype()), momentum_);
    running_var.mul_(1 - momentum_)
        .add_(Tensor::from_vector(unbiased).to(running_var.dtype()), momentum_);
    num_batches_tracked.add_(1.0);
  }
  std::vector<double> rstd(c);
  for (size_t k = 0; k < c; k++) rstd[k] = 1 / std::sqrt(var[k] + eps_);
  const Tensor w = weight.defined() ? weight.detach() : Tensor::ones({C}, x.dtype());
  const Tensor b = bias.defined() ? bias.detach() : Tensor::zeros({C}, x.dtype());
  Shape per_channel(size_t(x.dim()), 1);
  per_channel[1] = C;
  return autograd::function(
      "sync_batch_norm", {x, weight, bias},
      [&] {
        // The whole batch's statistics normalise x as given statistics do (one kernel).
        return F::batch_norm(x.detach(), Tensor::from_vector(mean).to(x.dtype()),
                             Tensor::from_vector(var).to(x.dtype()), w, b, false, 0.0, eps_);
      },
      [xd = x.detach(), mean_c = along_channels(mean, x), rstd_c = along_channels(rstd, x),
       w_c = w.reshape(per_channel), axes, n, has_w = weight.defined(),
       has_b = bias.defined()](const Tensor& g) {
        // With xhat = (x - mean) rstd over the whole batch: dx = w rstd (g - sum(g) / n -
        // xhat sum(g xhat) / n), the sums over every rank's values of the channel.
        const Tensor xhat = mul(sub(xd, mean_c), rstd_c);
        const Tensor sum_g = sum(g, axes), sum_gx = sum(mul(g, xhat), axes);
        const std::vector<double> s = summed_over_ranks({sum_g, sum_gx});
        const auto half = s.begin() + std::ptrdiff_t(s.size() / 2);
        const Tensor all_g = along_channels(std::vector<double>(s.begin(), half), xd),
                     all_gx = along_channels(std::vector<double>(half, s.end()), xd);
        const Tensor dx =
            mul(mul(sub(sub(g, div(all_g, n)), mul(xhat, div(all_gx, n))), rstd_c), w_c);
        return std::vector<Tensor>{dx, has_w ? sum_gx : Tensor(), has_b ? sum_g : Tensor()};
      });
}

}  // namespace opforge::torch::nn
