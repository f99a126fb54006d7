// opforge::torch against PyTorch itself: the inputs, results and gradients of layers, losses and
// optimiser steps that tests/fixtures/make_torch_reference.py computed with PyTorch and saved with
// safetensors.torch (so loading the fixture also checks that a file PyTorch wrote loads here). The
// same calls run in opforge, in float64, and every element is compared.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "opforge/opforge.hpp"
#include "opforge/safetensors.hpp"
#include "opforge/torch.hpp"

#ifndef OPFORGE_FIXTURES_DIR
#error "OPFORGE_FIXTURES_DIR must name tests/fixtures"
#endif

namespace {
using namespace opforge;
using namespace opforge::torch;

const std::map<std::string, Tensor>& fixture() {
  static const SafetensorsFile f =
      load_safetensors(std::string(OPFORGE_FIXTURES_DIR) + "/torch_reference.safetensors");
  return f.tensors;
}
Tensor get(const std::string& name) {
  auto it = fixture().find(name);
  if (it == fixture().end()) throw Error("the fixture has no tensor " + name);
  return it->second;
}
// A fresh leaf that requires a gradient, with the fixture's values.
Tensor leaf(const std::string& name) { return get(name).clone().requires_grad_(); }

void expect_same(const Tensor& got, const std::string& name, double tol = 1e-10) {
  SCOPED_TRACE(name);
  Tensor want = get(name);
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.shape(), want.shape());
  std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  for (size_t i = 0; i < g.size(); i++)
    EXPECT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << "element " << i;
}

// Runs `f` on the fixture's inputs of `prefix`, backpropagates sum(result * w), and compares the
// result and each input's gradient with PyTorch's.
void check(const std::string& prefix, const std::vector<std::string>& inputs,
           const std::function<Tensor(std::vector<Tensor>&)>& f) {
  SCOPED_TRACE(prefix);
  std::vector<Tensor> in;
  for (const std::string& n : inputs) in.push_back(leaf(prefix + "." + n));
  Tensor y = f(in);
  expect_same(y, prefix + ".out");
  sum(mul(y, get(prefix + ".w"))).backward();
  for (size_t i = 0; i < inputs.size(); i++)
    expect_same(in[i].grad(), prefix + ".grad_" + inputs[i]);
}

TEST(TorchReference, TheFixtureIsWhatPyTorchWrote) {
  SafetensorsFile f =
      load_safetensors(std::string(OPFORGE_FIXTURES_DIR) + "/torch_reference.safetensors");
  EXPECT_EQ(f.metadata.at("made_by"), "tests/fixtures/make_torch_reference.py");
  EXPECT_GE(f.tensors.size(), 100u);
  EXPECT_EQ(get("losses.target").dtype(), DType::Int64);
  EXPECT_EQ(get("linear.x").dtype(), DType::Float64);
}

TEST(TorchReference, Layers) {
  check("linear", {"x", "weight", "bias"}, [](auto& t) { return F::linear(t[0], t[1], t[2]); });
  check("conv2d", {"x", "weight", "bias"}, [](auto& t) {
    return F::conv2d(t[0], t[1], t[2], Conv2dOptions{{2, 1}, {1, 2}, {1, 2}, 1});
  });
  check("conv2d_groups", {"x", "weight"}, [](auto& t) {
    return F::conv2d(t[0], t[1], {}, Conv2dOptions{{1, 1}, {1, 1}, {1, 1}, 2});
  });
  check("conv_transpose2d", {"x", "weight", "bias"}, [](auto& t) {
    ConvTranspose2dOptions o;
    o.stride = {2, 3};
    o.padding = {1, 0};
    o.output_padding = {1, 2};
    o.groups = 2;
    return F::conv_transpose2d(t[0], t[1], t[2], o);
  });
  Pool2dOptions pool;
  pool.kernel = {3, 3};
  pool.stride = {2, 2};
  pool.padding = {1, 1};
  check("max_pool2d", {"x"}, [&](auto& t) { return F::max_pool2d(t[0], pool); });
  pool.count_include_pad = false;
  check("avg_pool2d", {"x"}, [&](auto& t) { return F::avg_pool2d(t[0], pool); });
  check("layer_norm", {"x", "weight", "bias"},
        [](auto& t) { return layer_norm(t[0], {5}, t[1], t[2], 1e-5); });
  Tensor rm = get("batch_norm.running_mean_before").clone(),
         rv = get("batch_norm.running_var_before").clone();
  check("batch_norm", {"x", "weight", "bias"},
        [&](auto& t) { return F::batch_norm(t[0], rm, rv, t[1], t[2], true, 0.1, 1e-5); });
  expect_same(rm, "batch_norm.running_mean_after");
  expect_same(rv, "batch_norm.running_var_after");
}

TEST(TorchReference, Activations) {
  check("relu", {"x"}, [](auto& t) { return F::relu(t[0]); });
  check("gelu", {"x"}, [](auto& t) { return F::gelu(t[0]); });
  check("sigmoid", {"x"}, [](auto& t) { return F::sigmoid(t[0]); });
  check("tanh", {"x"}, [](auto& t) { return F::tanh(t[0]); });
  check("softmax", {"x"}, [](auto& t) { return F::softmax(t[0], 1); });
  check("log_softmax", {"x"}, [](auto& t) { return F::log_softmax(t[0], 1); });
}

TEST(TorchReference, Losses) {
  Tensor target = get("losses.target");
  check("cross_entropy", {"x"}, [&](auto& t) { return F::cross_entropy(t[0], target); });
  check("cross_entropy_smoothing", {"x"},
        [&](auto& t) { return F::cross_entropy(t[0], target, 0.1); });
  check("nll_loss", {"x"},
        [&](auto& t) { return F::nll_loss(F::log_softmax(t[0], 1), target, F::Reduction::sum); });
  check("mse_loss", {"x"}, [&](auto& t) { return F::mse_loss(t[0], get("mse_loss.target")); });
}

// Two steps of each optimiser (one generated kernel per parameter and step) from the same start
// and gradients as PyTorch's.
TEST(TorchReference, OptimiserSteps) {
  auto run = [](const std::string& name,
                const std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>& make) {
    SCOPED_TRACE(name);
    Tensor p = leaf("optim." + name + ".param");
    auto opt = make({p});
    for (int step = 0; step < 2; step++) {
      p.set_grad(get("optim." + name + ".grad" + std::to_string(step)).clone());
      opt->step();
    }
    expect_same(p, "optim." + name + ".after");
  };
  run("sgd", [](auto p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1}); });
  run("sgd_momentum", [](auto p) {
    return std::make_unique<optim::SGD>(
        p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01});
  });
  run("sgd_nesterov", [](auto p) {
    return std::make_unique<optim::SGD>(
        p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  });
  run("adam", [](auto p) {
    return std::make_unique<optim::Adam>(
        p, optim::AdamOptions{
               .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.02});
  });
  run("adamw", [](auto p) {
    return std::make_unique<optim::AdamW>(
        p, optim::AdamWOptions{
               .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.02});
  });
}

}  // namespace
