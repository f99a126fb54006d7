// The optimiser steps: each parameter's update is one call of a generated elementwise kernel with
// several inout buffers (dsl/opforge/ops/elementwise.hpp: sgd_, sgd_momentum_, adam_), so a step
// reads the gradient and the state once and writes the parameter and the state once.
#include <cmath>

#include "opforge/autograd.hpp"
#include "opforge/error.hpp"
#include "opforge/ops.hpp"

namespace opforge {
namespace {

// Checks a step's tensors: a floating parameter, a gradient of its shape and state tensors of its
// shape and dtype. Returns the gradient at the parameter's dtype.
Tensor check_step(const char* op, const Tensor& param, const Tensor& grad,
                  std::initializer_list<std::pair<const char*, const Tensor*>> state) {
  OPFORGE_CHECK(param.defined() && is_floating(param.dtype()))
      << op << ": the parameter must be a floating tensor, got "
      << (param.defined() ? dtype_name(param.dtype()) : "an undefined one");
  OPFORGE_CHECK(grad.defined() && grad.shape() == param.shape())
      << op << ": the gradient has shape "
      << (grad.defined() ? shape_str(grad.shape()) : "undefined") << ", the parameter "
      << shape_str(param.shape());
  for (const auto& [name, t] : state)
    OPFORGE_CHECK(t->defined() && t->shape() == param.shape() && t->dtype() == param.dtype())
        << op << ": " << name << " must have the parameter's shape " << shape_str(param.shape())
        << " and dtype " << dtype_name(param.dtype()) << ", got "
        << (t->defined() ? shape_str(t->shape()) + " " + std::string(dtype_name(t->dtype()))
                         : std::string("an undefined tensor"));
  return grad.dtype() == param.dtype() ? grad : grad.to(param.dtype());
}

void check_finite(const char* op, std::initializer_list<std::pair<const char*, double>> values) {
  for (const auto& [name, v] : values)
    OPFORGE_CHECK(std::isfinite(v)) << op << ": " << name << " is " << v;
}

}  // namespace

void sgd_step_(const Tensor& param, const Tensor& grad, double lr, double weight_decay) {
  Tensor g = check_step("sgd_step_", param, grad, {});
  check_finite("sgd_step_", {{"lr", lr}, {"weight_decay", weight_decay}});
  autograd::NoGradGuard no_grad;
  elementwise_results("sgd_", {param, g}, {lr, weight_decay});
}

void sgd_momentum_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                        double lr, double momentum, double dampening, double weight_decay,
                        bool nesterov, bool first_step) {
  Tensor g =
      check_step("sgd_momentum_step_", param, grad, {{"the momentum buffer", &momentum_buffer}});
  check_finite("sgd_momentum_step_", {{"lr", lr},
                                      {"momentum", momentum},
                                      {"dampening", dampening},
                                      {"weight_decay", weight_decay}});
  autograd::NoGradGuard no_grad;
  elementwise_results(
      "sgd_momentum_", {param, g, momentum_buffer},
      {lr, momentum, dampening, weight_decay, nesterov ? 1.0 : 0.0, first_step ? 1.0 : 0.0});
}

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, bool decoupled_weight_decay, int64_t step) {
  Tensor g =
      check_step("adam_step_", param, grad, {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  check_finite("adam_step_", {{"lr", lr},
                              {"beta1", beta1},
                              {"beta2", beta2},
                              {"eps", eps},
                              {"weight_decay", weight_decay}});
  OPFORGE_CHECK(step >= 1) << "adam_step_: step is " << step << ", the first is 1";
  OPFORGE_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)
      << "adam_step_: betas (" << beta1 << ", " << beta2 << ") must be in [0, 1)";
  const double bc1 = 1 - std::pow(beta1, double(step)), bc2 = 1 - std::pow(beta2, double(step));
  autograd::NoGradGuard no_grad;
  elementwise_results(
      "adam_", {param, g, exp_avg, exp_avg_sq},
      {lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay ? 1.0 : 0.0, bc1, bc2});
}

}  // namespace opforge
