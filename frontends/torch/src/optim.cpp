// The optimisers' update rules, written as torch.optim's reference (single-tensor, for-loop)
// implementations are.
#include "opforge/torch/optim.hpp"

#include <cmath>
#include <numbers>

#include "opforge/autograd.hpp"
#include "opforge/ops.hpp"

namespace opforge::torch::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); i++)
    OPFORGE_CHECK(params_[i].defined() && params_[i].requires_grad())
        << "optimizer: parameter " << i << " is undefined or does not require a gradient";
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  OPFORGE_CHECK(lr >= 0 && std::isfinite(lr))
      << "optimizer: learning rate " << lr << " is not a finite number >= 0";
  lr_ = lr;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (set_to_none)
      p.set_grad({});
    else if (p.grad().defined())
      p.grad().zero_();
  }
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o)
    : Optimizer(std::move(params), o.lr), o_(o), momentum_(params_.size()) {
  OPFORGE_CHECK(o.momentum >= 0 && o.weight_decay >= 0)
      << "SGD: momentum " << o.momentum << " and weight_decay " << o.weight_decay
      << " must be >= 0";
  OPFORGE_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0))
      << "SGD: Nesterov momentum needs momentum > 0 and dampening 0";
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) g = add(g, mul(p, o_.weight_decay));
    if (o_.momentum != 0) {
      Tensor& buf = momentum_[i];
      if (!buf.defined())
        buf = g.clone();
      else
        buf.mul_(o_.momentum).add_(g, 1 - o_.dampening);
      g = o_.nesterov ? add(g, mul(buf, o_.momentum)) : buf;
    }
    p.add_(g, -lr_);
  }
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o, bool decoupled)
    : Optimizer(std::move(params), o.lr),
      o_(o),
      decoupled_(decoupled),
      m_(params_.size()),
      v_(params_.size()) {
  OPFORGE_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)
      << "Adam: betas (" << o.beta1 << ", " << o.beta2 << ") must be in [0, 1)";
  OPFORGE_CHECK(o.eps >= 0 && o.weight_decay >= 0) << "Adam: eps and weight_decay must be >= 0";
}

void Adam::step() {
  autograd::NoGradGuard no_grad;
  t_++;
  const double bc1 = 1 - std::pow(o_.beta1, double(t_)), bc2 = 1 - std::pow(o_.beta2, double(t_));
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.weight_decay != 0) {
      if (decoupled_)
        p.mul_(1 - lr_ * o_.weight_decay);
      else
        g = add(g, mul(p, o_.weight_decay));
    }
    if (!m_[i].defined()) {
      m_[i] = Tensor::zeros(p.shape(), p.dtype());
      v_[i] = Tensor::zeros(p.shape(), p.dtype());
    }
    m_[i].mul_(o_.beta1).add_(g, 1 - o_.beta1);
    v_[i].mul_(o_.beta2).add_(mul(g, g), 1 - o_.beta2);
    Tensor denom = add(div(sqrt(v_[i]), std::sqrt(bc2)), o_.eps);
    p.add_(div(m_[i], denom), -lr_ / bc1);
  }
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt), step_size_(step_size), gamma_(gamma) {
  OPFORGE_CHECK(step_size > 0) << "StepLR: step_size must be positive, got " << step_size;
}

double StepLR::lr_at(int64_t epoch, double base) const {
  return base * std::pow(gamma_, double(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : LRScheduler(opt), t_max_(t_max), eta_min_(eta_min) {
  OPFORGE_CHECK(t_max > 0) << "CosineAnnealingLR: T_max must be positive, got " << t_max;
}

double CosineAnnealingLR::lr_at(int64_t epoch, double base) const {
  double c = std::cos(std::numbers::pi * double(epoch) / double(t_max_));
  return eta_min_ + (base - eta_min_) * (1 + c) / 2;
}

}  // namespace opforge::torch::optim
