// Dropout and BatchNorm2d, the layers whose training-mode forward keeps state (random draws,
// running statistics): alone, and inside a DataParallel share (share_state.hpp), where several
// devices' threads run them at once.
#include <cmath>
#include <cstring>

#include "opforge/autograd.hpp"
#include "share_state.hpp"

namespace opforge::torch::nn {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <class T>
void fill_mask(T* out, int64_t n, int64_t first, uint64_t key, double p) {
  const T scale = T(1 / (1 - p));
  for (int64_t e = 0; e < n; e++) {
    // A counter-based draw (no state between elements): uniform in [0, 1) from 53 bits.
    const double u = double(splitmix64(key ^ splitmix64(uint64_t(first + e))) >> 11) * 0x1p-53;
    out[e] = u >= p ? scale : T(0);
  }
}

// x's dropout where element e of the rows from `first_row` on keeps or drops by a draw that
// depends only on (key, its place in the whole batch).
Tensor dropout_by_place(const Tensor& x, double p, uint64_t key, int64_t first_row) {
  if (p == 0) return x;
  if (p == 1) return mul(x, 0.0);
  OPFORGE_CHECK(is_floating(x.dtype()))
      << "Dropout: expected a float32 or float64 input, got " << dtype_name(x.dtype());
  const int64_t rows = x.dim() == 0 ? 1 : x.size(0);
  const int64_t per_row = rows == 0 ? 0 : x.numel() / rows;
  Tensor mask = Tensor::empty(x.shape(), x.dtype());
  if (x.dtype() == DType::Float32)
    fill_mask(mask.data_ptr<float>(), mask.numel(), first_row * per_row, key, p);
  else
    fill_mask(mask.data_ptr<double>(), mask.numel(), first_row * per_row, key, p);
  return mul(x, mask.to(x.device()));
}
}  // namespace

ShareState*& current_share() {
  thread_local ShareState* share = nullptr;
  return share;
}

Tensor Dropout::forward(const Tensor& x) {
  ShareState* share = current_share();
  if (!share || !is_training() || !share->dropout_seeds)
    return F::dropout(x, p_, is_training(), *g_);
  OPFORGE_CHECK(x.defined()) << "dropout: input is undefined";
  auto seed = share->dropout_seeds->find(this);
  OPFORGE_CHECK(seed != share->dropout_seeds->end())
      << "Dropout: a layer outside the DataParallel module ran in one of its shares";
  const uint64_t call = share->dropout_calls[this]++;
  return dropout_by_place(x, p_, splitmix64(seed->second ^ splitmix64(call)), share->first_sample);
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (sync_) return sync_forward(x);
  OPFORGE_CHECK(x.defined() && x.dim() == 4) << "BatchNorm2d: expected an (N, C, H, W) input, got "
                                             << (x.defined() ? shape_str(x.shape()) : "undefined");
  ShareState* share = current_share();
  if (is_training() && share && running_mean.defined()) {
    // The rows' own statistics, kept for one update of the running ones after the step: with
    // momentum 1 the call leaves its mean and unbiased variance in buffers of the share's own.
    RowStats rows{x.numel() / x.size(1), Tensor::zeros(running_mean.shape(), running_mean.dtype()),
                  Tensor::zeros(running_var.shape(), running_var.dtype())};
    Tensor y = F::batch_norm(x, rows.mean, rows.var, weight, bias, true, 1.0, eps_);
    share->batch_stats.push_back({this, std::move(rows)});
    return y;
  }
  if (is_training()) {
    autograd::NoGradGuard no_grad;
    num_batches_tracked.add_(1.0);
  }
  return F::batch_norm(x, running_mean, running_var, weight, bias, is_training(), momentum_, eps_);
}

void BatchNorm2d::update_running_stats(const std::vector<RowStats>& parts) {
  OPFORGE_CHECK(running_mean.defined())
      << "BatchNorm2d: update_running_stats on a layer without running statistics";
  if (parts.empty()) return;
  const size_t C = size_t(running_mean.numel());
  // Chan et al.'s pairwise merge in float64: the whole batch's mean and biased variance from the
  // parts' counts, means and variances.
  std::vector<double> mean(C, 0), m2(C, 0);
  double n = 0;
  for (const RowStats& part : parts) {
    OPFORGE_CHECK(part.count > 1 && part.mean.numel() == int64_t(C) &&
                  part.var.numel() == int64_t(C))
        << "BatchNorm2d: a part's statistics must cover " << C << " channels and more than one "
        << "value each, got " << part.count << " values of " << part.mean.numel() << " channels";
    const std::vector<double> pm = part.mean.to_double_vector(), pv = part.var.to_double_vector();
    const double k = double(part.count), total = n + k;
    for (size_t c = 0; c < C; c++) {
      const double delta = pm[c] - mean[c];
      mean[c] += delta * k / total;
      m2[c] += pv[c] * (k - 1) + delta * delta * n * k / total;
    }
    n = total;
  }
  std::vector<double> unbiased(C);
  for (size_t c = 0; c < C; c++) unbiased[c] = m2[c] / (n - 1);
  autograd::NoGradGuard no_grad;
  auto blend = [&](Tensor& running, const std::vector<double>& batch) {
    running.mul_(1 - momentum_).add_(Tensor::from_vector(batch).to(running.dtype()), momentum_);
  };
  blend(running_mean, mean);
  blend(running_var, unbiased);
  num_batches_tracked.add_(1.0);
}

}  // namespace opforge::torch::nn
