// The optimisers: their state, and each step as one generated kernel per parameter that updates
// the parameter and its state in place (opforge::sgd_step_, sgd_momentum_step_, adam_step_).
#include "opforge/torch/optim.hpp"

#include <algorithm>
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

Tensor& Optimizer::buffer(const std::string& name, size_t i) {
  std::vector<Tensor>& all = buffers_[name];
  all.resize(params_.size());
  if (!all[i].defined()) all[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype());
  return all[i];
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out{{"lr", Tensor::scalar(lr_, DType::Float64)},
                                    {"step", Tensor::scalar(double(step_), DType::Int64)}};
  for (const auto& [name, all] : buffers_)
    for (size_t i = 0; i < all.size(); i++)
      if (all[i].defined()) out.emplace(std::to_string(i) + "." + name, all[i]);
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto parse = [&](const std::string& key, size_t& index, std::string& name) {
    size_t dot = key.find('.');
    OPFORGE_CHECK(dot != std::string::npos && dot > 0 && key.find_first_not_of("0123456789") == dot)
        << "optimizer state: unexpected entry \"" << key << "\"";
    index = std::stoul(key.substr(0, dot));
    name = key.substr(dot + 1);
    OPFORGE_CHECK(index < params_.size())
        << "optimizer state: entry \"" << key << "\" for parameter " << index << ", but there are "
        << params_.size();
    OPFORGE_CHECK(std::find(buffer_names_.begin(), buffer_names_.end(), name) !=
                  buffer_names_.end())
        << "optimizer state: entry \"" << key << "\": this optimiser keeps no " << name;
  };
  for (const auto& [key, t] : state) {
    OPFORGE_CHECK(t.defined()) << "optimizer state: entry \"" << key << "\" is undefined";
    if (key == "lr" || key == "step") {
      OPFORGE_CHECK(t.numel() == 1) << "optimizer state: \"" << key << "\" must be one value";
      const double v = t.item();
      OPFORGE_CHECK(std::isfinite(v) && v >= 0)
          << "optimizer state: \"" << key << "\" is " << v << ", expected a finite value >= 0";
      continue;
    }
    size_t i;
    std::string name;
    parse(key, i, name);
    OPFORGE_CHECK(t.shape() == params_[i].shape())
        << "optimizer state: entry \"" << key << "\" has shape " << shape_str(t.shape())
        << ", parameter " << i << " has " << shape_str(params_[i].shape());
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [key, t] : state) {
    if (key == "lr") {
      set_lr(t.item());
    } else if (key == "step") {
      step_ = int64_t(t.item());
    } else {
      size_t i;
      std::string name;
      parse(key, i, name);
      buffer(name, i).copy_(t);
    }
  }
}

void zero_grads(const std::vector<Tensor>& params, bool set_to_none) {
  for (Tensor p : params) {
    if (set_to_none)
      p.set_grad({});
    else if (p.grad().defined())
      p.grad().zero_();
  }
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& o)
    : Optimizer(std::move(params), o.lr), o_(o) {
  buffer_names_ = {"momentum_buffer"};
  OPFORGE_CHECK(o.momentum >= 0 && o.weight_decay >= 0)
      << "SGD: momentum " << o.momentum << " and weight_decay " << o.weight_decay
      << " must be >= 0";
  OPFORGE_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0))
      << "SGD: Nesterov momentum needs momentum > 0 and dampening 0";
}

// Each parameter's update is one generated kernel (opforge::sgd_step_, sgd_momentum_step_).
void SGD::step() {
  autograd::NoGradGuard no_grad;
  step_++;
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.momentum == 0) {
      sgd_step_(p, g, lr_, o_.weight_decay);
      continue;
    }
    // The first step's buffer is the gradient itself (torch.optim.SGD), then it decays.
    const bool first =
        buffers_["momentum_buffer"].size() <= i || !buffers_["momentum_buffer"][i].defined();
    sgd_momentum_step_(p, g, buffer("momentum_buffer", i), lr_, o_.momentum, o_.dampening,
                       o_.weight_decay, o_.nesterov, first);
  }
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& o, bool decoupled)
    : Optimizer(std::move(params), o.lr), o_(o), decoupled_(decoupled) {
  buffer_names_ = {"exp_avg", "exp_avg_sq"};
  OPFORGE_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)
      << "Adam: betas (" << o.beta1 << ", " << o.beta2 << ") must be in [0, 1)";
  OPFORGE_CHECK(o.eps >= 0 && o.weight_decay >= 0) << "Adam: eps and weight_decay must be >= 0";
}

// Each parameter's update is one generated kernel (opforge::adam_step_).
void Adam::step() {
  autograd::NoGradGuard no_grad;
  step_++;
  for (size_t i = 0; i < params_.size(); i++) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    adam_step_(p, g, buffer("exp_avg", i), buffer("exp_avg_sq", i), lr_, o_.beta1, o_.beta2, o_.eps,
               o_.weight_decay, decoupled_, step_);
  }
}

namespace {
int64_t positive(const char* what, int64_t v) {
  OPFORGE_CHECK(v > 0) << what << " must be positive, got " << v;
  return v;
}
}  // namespace

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LambdaLR(opt, [n = positive("StepLR: step_size", step_size), gamma](int64_t e, double base) {
        return base * std::pow(gamma, double(e / n));
      }) {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : LambdaLR(
          opt, [t = positive("CosineAnnealingLR: T_max", t_max), eta_min](int64_t e, double base) {
            return eta_min +
                   (base - eta_min) * (1 + std::cos(std::numbers::pi * double(e) / double(t))) / 2;
          }) {}

}  // namespace opforge::torch::optim
