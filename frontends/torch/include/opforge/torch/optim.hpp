// opforge::torch::optim: torch.optim's SGD, Adam and AdamW (the same update rules, step for step)
// and the StepLR and CosineAnnealingLR schedules. A step runs under no_grad and updates each
// parameter and its state in place with one generated kernel per parameter (opforge::sgd_step_,
// sgd_momentum_step_, adam_step_).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "opforge/tensor.hpp"

namespace opforge::torch::optim {

// Clears each tensor's gradient (set_to_none) or zeroes it in place: what Optimizer::zero_grad
// and nn::Module::zero_grad do to their parameters.
void zero_grads(const std::vector<Tensor>& params, bool set_to_none = true);

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  void zero_grad(bool set_to_none = true) { zero_grads(params_, set_to_none); }
  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }
  // The optimiser's state as named tensors, ready for save_safetensors: "lr", "step" (updates so
  // far) and each parameter's buffers as "<index>.<buffer>" ("0.momentum_buffer"; Adam's
  // "0.exp_avg" and "0.exp_avg_sq"), those made so far. load_state_dict checks every entry (a
  // name this optimiser does not have, a shape that is not its parameter's) before it sets any.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  // Parameter i's buffer `name`, made as zeros of the parameter's shape on first use.
  Tensor& buffer(const std::string& name, size_t i);
  std::vector<Tensor> params_;
  double lr_;
  int64_t step_ = 0;
  std::vector<std::string> buffer_names_;               // the kinds of buffer this one keeps
  std::map<std::string, std::vector<Tensor>> buffers_;  // by kind, one per parameter
};

struct SGDOptions {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& o);
  void step() override;

 private:
  SGDOptions o_;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
// Adam (weight decay added to the gradient) and, with decoupled = true, AdamW (weight decay
// applied to the parameter: p *= 1 - lr * weight_decay).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& o, bool decoupled = false);
  void step() override;
  int64_t steps() const { return step_; }

 private:
  AdamOptions o_;
  bool decoupled_;
};
struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& o)
      : Adam(std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, true) {}
};

// Learning-rate schedules: step() once per epoch, as in PyTorch; each sets the optimiser's rate
// to rate(epoch, base) from the epochs counted so far and the rate it had when the schedule was
// made (torch.optim.lr_scheduler.LambdaLR, with the base passed in).
class LambdaLR {
 public:
  using Rate = std::function<double(int64_t epoch, double base)>;
  LambdaLR(Optimizer& opt, Rate rate) : opt_(opt), rate_(std::move(rate)), base_(opt.lr()) {}
  void step() { opt_.set_lr(rate_(++epoch_, base_)); }
  int64_t epoch() const { return epoch_; }

 private:
  Optimizer& opt_;
  Rate rate_;
  double base_;
  int64_t epoch_ = 0;
};
// base * gamma^(epoch / step_size), the division rounded down.
class StepLR : public LambdaLR {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
};
// eta_min + (base - eta_min) (1 + cos(pi epoch / t_max)) / 2.
class CosineAnnealingLR : public LambdaLR {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0);
};

}  // namespace opforge::torch::optim
