// opforge::torch: the Module tree and state_dict, the layers' initialisation, the losses against
// float64 formulas (values and gradients), the optimisers step for step against their update
// rules, the schedules, and a small classifier that trains.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "opforge/autograd.hpp"
#include "opforge/safetensors.hpp"
#include "opforge/torch.hpp"

namespace {
using namespace opforge;
using namespace opforge::torch;

TEST(TorchNn, LinearInitialisesAndComputesAsPyTorch) {
  Generator g(1);
  nn::Linear fc(16, 4, true, DType::Float64, g);
  for (const Tensor& p : {fc.weight, fc.bias}) {
    EXPECT_TRUE(p.requires_grad());
    for (double v : p.to_double_vector()) EXPECT_LE(std::abs(v), 0.25);  // 1/sqrt(16)
  }
  Tensor x = Tensor::randn({3, 16}, DType::Float64, g);
  auto y = fc(x).to_double_vector(), xv = x.to_double_vector(), w = fc.weight.to_double_vector(),
       b = fc.bias.to_double_vector();
  for (int i = 0; i < 3; i++)
    for (int o = 0; o < 4; o++) {
      double ref = b[o];
      for (int k = 0; k < 16; k++) ref += xv[i * 16 + k] * w[o * 16 + k];
      EXPECT_NEAR(y[i * 4 + o], ref, 1e-12);
    }
  // a batch of 3-D inputs takes the matmul path
  EXPECT_EQ(fc(Tensor::randn({2, 3, 16}, DType::Float64, g)).shape(), (Shape{2, 3, 4}));
  EXPECT_THROW(fc(Tensor::randn({3, 15}, DType::Float64, g)), Error);
}

TEST(TorchNn, NamesStateDictAndLoading) {
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(3, 2)});
  std::vector<std::string> names;
  for (auto& [n, t] : net->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  auto other = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(3, 2)});
  other->load_state_dict(net->state_dict());
  auto a = net->state_dict(), b = other->state_dict();
  for (auto& [n, t] : a) EXPECT_EQ(t.to_double_vector(), b.at(n).to_double_vector()) << n;
  // the member and the registered entry are one tensor: a load is seen through the layer
  auto* first = dynamic_cast<nn::Linear*>(other->named_children()[0].second.get());
  EXPECT_EQ(first->weight.to_double_vector(), a.at("0.weight").to_double_vector());
  auto missing = a;
  missing.erase("2.bias");
  EXPECT_THROW(other->load_state_dict(missing), Error);
  other->load_state_dict(missing, false);
  auto extra = a;
  extra["3.weight"] = Tensor::zeros({1});
  EXPECT_THROW(other->load_state_dict(extra), Error);
  // a refused load writes nothing, though its good entries sort before the bad one
  auto fresh = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(3, 2)});
  std::map<std::string, std::vector<double>> before;
  for (auto& [n, t] : fresh->state_dict()) before[n] = t.to_double_vector();
  auto wrong = a;
  wrong["2.weight"] = Tensor::zeros({4});
  EXPECT_THROW(fresh->load_state_dict(wrong), Error);
  for (auto& [n, t] : fresh->state_dict()) EXPECT_EQ(t.to_double_vector(), before.at(n)) << n;
  net->eval();
  EXPECT_FALSE(net->named_children()[1].second->is_training());
  // through safetensors: a module's state_dict is a file's tensors
  std::string path = testing::TempDir() + "opforge_state_dict.safetensors";
  save_safetensors(path, net->state_dict());
  auto third = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(3, 2)});
  third->load_state_dict(load_safetensors(path).tensors);
  std::filesystem::remove(path);
  for (auto& [n, t] : third->state_dict())
    EXPECT_EQ(t.to_double_vector(), a.at(n).to_double_vector()) << n;
}

// cross_entropy's value and gradient against the float64 formula: with q the smoothed one-hot
// target, loss = -mean_i sum_c q_ic log softmax(z)_ic and d loss / dz = (softmax(z) - q) / N.
TEST(TorchFunctional, CrossEntropyMatchesItsFormula) {
  Generator g(2);
  const int N = 5, C = 4;
  for (double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(smoothing);
    Tensor z = Tensor::randn({N, C}, DType::Float64, g).requires_grad_();
    Tensor target = Tensor::from_vector<int64_t>({0, 3, 1, 1, 2}, {N});
    Tensor loss = F::cross_entropy(z, target, smoothing);
    loss.backward();
    auto zv = z.to_double_vector(), gz = z.grad().to_double_vector();
    auto t = target.to_vector<int64_t>();
    double ref = 0;
    for (int i = 0; i < N; i++) {
      double mx = -1e300, s = 0;
      for (int c = 0; c < C; c++) mx = std::max(mx, zv[i * C + c]);
      for (int c = 0; c < C; c++) s += std::exp(zv[i * C + c] - mx);
      for (int c = 0; c < C; c++) {
        double q = (c == t[i] ? 1 - smoothing : 0) + smoothing / C;
        double p = std::exp(zv[i * C + c] - mx) / s;
        ref -= q * (zv[i * C + c] - mx - std::log(s)) / N;
        EXPECT_NEAR(gz[i * C + c], (p - q) / N, 1e-12);
      }
    }
    EXPECT_NEAR(loss.item(), ref, 1e-12);
  }
  // Class probabilities, PyTorch's other target form: one-hot rows give the indices' loss.
  {
    Tensor z2 = Tensor::randn({N, C}, DType::Float64, g);
    Tensor t2 = Tensor::from_vector<int64_t>({0, 3, 1, 1, 2}, {N});
    EXPECT_NEAR(F::cross_entropy(z2, F::one_hot(t2, C, DType::Float64), 0.1).item(),
                F::cross_entropy(z2, t2, 0.1).item(), 1e-12);
    EXPECT_THROW(F::cross_entropy(z2, Tensor::zeros({N, C + 1}, DType::Float64)), Error);
  }
  // a masked (-inf) logit elsewhere does not make the loss NaN
  Tensor masked = Tensor::from_vector<double>({1, -INFINITY, 0.5}, {1, 3}).requires_grad_();
  Tensor ce = F::cross_entropy(masked, Tensor::from_vector<int64_t>({0}, {1}));
  EXPECT_TRUE(std::isfinite(ce.item()));
  ce.backward();
  auto gm = masked.grad().to_double_vector();
  for (double v : gm) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(gm[1], 0);
  Tensor z = Tensor::randn({2, 3}, DType::Float64, g);
  EXPECT_THROW(F::cross_entropy(z, Tensor::from_vector<int64_t>({0, 3}, {2})), Error);
  EXPECT_THROW(F::cross_entropy(z, Tensor::from_vector<double>({0, 1}, {2})), Error);
  EXPECT_THROW(F::cross_entropy(z, Tensor::from_vector<int64_t>({0}, {1})), Error);
  // on the same log-probabilities (a second log_softmax may run in another variant, rounding
  // otherwise)
  Tensor lsm = log_softmax(z, 1);
  auto nll = F::nll_loss(lsm, Tensor::from_vector<int64_t>({2, 0}, {2}), F::Reduction::none)
                 .to_double_vector();
  auto lz = lsm.to_double_vector();
  ASSERT_EQ(nll.size(), 2u);
  EXPECT_NEAR(nll[0], -lz[2], 1e-15);
  EXPECT_NEAR(nll[1], -lz[3], 1e-15);
}

TEST(TorchFunctional, MseLossAndDropout) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor b = Tensor::from_vector<double>({0, 4, 3}, {3});
  Tensor l = F::mse_loss(a, b);
  EXPECT_DOUBLE_EQ(l.item(), 5.0 / 3);
  l.backward();
  auto ga = a.grad().to_double_vector();
  EXPECT_DOUBLE_EQ(ga[0], 2.0 / 3);
  EXPECT_DOUBLE_EQ(ga[1], -4.0 / 3);
  EXPECT_DOUBLE_EQ(ga[2], 0);
  Generator g(3);
  Tensor x = Tensor::ones({10000}, DType::Float64);
  EXPECT_EQ(F::dropout(x, 0.3, false).storage(), x.storage());
  auto d = F::dropout(x, 0.3, true, g).to_double_vector();
  int zeros = 0;
  for (double v : d) {
    if (v == 0)
      zeros++;
    else
      EXPECT_DOUBLE_EQ(v, 1 / 0.7);
  }
  EXPECT_NEAR(zeros / 10000.0, 0.3, 0.03);
  EXPECT_THROW(F::dropout(x, 1.5), Error);
}

TEST(TorchOptim, SgdWithMomentumNesterovAndWeightDecayStepsAsItsRule) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov);
    Tensor p = Tensor::from_vector<double>({1, -2}, {2}).requires_grad_();
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
    std::vector<double> pv = {1, -2}, buf(2);
    for (int step = 0; step < 3; step++) {
      opt.zero_grad();
      sum(mul(mul(p, p), 0.5)).backward();  // grad = p
      opt.step();
      for (int i = 0; i < 2; i++) {
        double g = pv[i] + 0.01 * pv[i];
        buf[i] = step == 0 ? g : 0.9 * buf[i] + g;
        pv[i] -= 0.1 * (nesterov ? g + 0.9 * buf[i] : buf[i]);
      }
      auto got = p.to_double_vector();
      for (int i = 0; i < 2; i++) EXPECT_NEAR(got[i], pv[i], 1e-14) << "step " << step;
    }
  }
}

TEST(TorchOptim, AdamAndAdamWStepAsTheirRules) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled);
    Tensor p = Tensor::from_vector<double>({0.5, -1.5, 2}, {3}).requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled)
      opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                           optim::AdamWOptions{.lr = 0.1, .weight_decay = 0.1});
    else
      opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                          optim::AdamOptions{.lr = 0.1, .weight_decay = 0.1});
    std::vector<double> pv = {0.5, -1.5, 2}, m(3), v(3);
    for (int t = 1; t <= 4; t++) {
      opt->zero_grad();
      sum(mul(mul(p, p), p)).backward();  // grad = 3 p^2
      opt->step();
      for (int i = 0; i < 3; i++) {
        double g = 3 * pv[i] * pv[i];
        if (decoupled)
          pv[i] *= 1 - 0.1 * 0.1;
        else
          g += 0.1 * pv[i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.999, t));
        pv[i] -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
      }
      auto got = p.to_double_vector();
      for (int i = 0; i < 3; i++) EXPECT_NEAR(got[i], pv[i], 1e-12) << "step " << t;
    }
  }
}

TEST(TorchNn, BatchNorm2dNormalisesPerChannelAndTracksRunningStatistics) {
  Generator g(11);
  const int N = 4, C = 3, HW = 4;
  nn::BatchNorm2d bn(C, 1e-5, 0.1, true, DType::Float64);
  {
    autograd::NoGradGuard no_grad;
    bn.weight.copy_(Tensor::randn({C}, DType::Float64, g));
    bn.bias.copy_(Tensor::randn({C}, DType::Float64, g));
  }
  Tensor x = Tensor::randn({N, C, 2, 2}, DType::Float64, g).requires_grad_();
  Tensor y = bn(x);
  auto xv = x.to_double_vector(), yv = y.to_double_vector(), w = bn.weight.to_double_vector(),
       b = bn.bias.to_double_vector(), rm = bn.running_mean.to_double_vector(),
       rv = bn.running_var.to_double_vector();
  for (int c = 0; c < C; c++) {
    double m = 0, v = 0;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) m += xv[size_t((n * C + c) * HW + k)] / (N * HW);
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) v += std::pow(xv[size_t((n * C + c) * HW + k)] - m, 2);
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) {
        size_t at = size_t((n * C + c) * HW + k);
        EXPECT_NEAR(yv[at], (xv[at] - m) / std::sqrt(v / (N * HW) + 1e-5) * w[c] + b[c], 1e-12);
      }
    EXPECT_NEAR(rm[c], 0.1 * m, 1e-14);
    EXPECT_NEAR(rv[c], 0.9 + 0.1 * v / (N * HW - 1), 1e-14);
  }
  EXPECT_EQ(bn.num_batches_tracked.item(), 1);
  // the gradient through the batch statistics, against central differences
  Tensor r = Tensor::randn({N, C, 2, 2}, DType::Float64, g);
  sum(mul(y, r)).backward();
  auto gx = x.grad().to_double_vector();
  autograd::NoGradGuard no_grad;
  for (size_t j : {size_t(0), size_t(7), size_t(29)}) {
    auto f = [&](double d) {
      auto v = xv;
      v[j] += d;
      Tensor xp = Tensor::from_vector(v, x.shape());
      return sum(mul(F::batch_norm(xp, {}, {}, bn.weight, bn.bias, true), r)).item();
    };
    EXPECT_NEAR(gx[j], (f(1e-6) - f(-1e-6)) / 2e-6, 1e-6) << j;
  }
  // evaluation uses the running statistics
  bn.eval();
  auto e = bn(x.detach()).to_double_vector();
  EXPECT_NEAR(e[0], (xv[0] - rm[0]) / std::sqrt(rv[0] + 1e-5) * w[0] + b[0], 1e-12);
  EXPECT_THROW(bn(Tensor::zeros({2, 4, 2, 2}, DType::Float64)), Error);
}

TEST(TorchOptim, StateRoundTripsThroughSafetensorsAndResumesExactly) {
  auto grad_step = [](optim::Optimizer& opt, Tensor& p) {
    opt.zero_grad();
    sum(mul(mul(p, p), p)).backward();
    opt.step();
  };
  for (int kind = 0; kind < 2; kind++) {
    SCOPED_TRACE(kind);
    auto make = [&](Tensor p) -> std::unique_ptr<optim::Optimizer> {
      if (kind == 0)
        return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                            optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      return std::make_unique<optim::Adam>(std::vector<Tensor>{p}, optim::AdamOptions{.lr = 0.1});
    };
    Tensor a = Tensor::from_vector<double>({0.5, -0.3, 0.8}, {3}).requires_grad_();
    auto opt_a = make(a);
    grad_step(*opt_a, a);
    grad_step(*opt_a, a);
    std::string path = testing::TempDir() + "opforge_optim.safetensors";
    save_safetensors(path, opt_a->state_dict());
    Tensor b = a.detach().clone().requires_grad_();
    auto opt_b = make(b);
    opt_b->load_state_dict(load_safetensors(path).tensors);
    std::filesystem::remove(path);
    EXPECT_EQ(opt_b->state_dict().at("step").item(), 2);
    grad_step(*opt_a, a);
    grad_step(*opt_b, b);
    auto av = a.to_double_vector(), bv = b.to_double_vector();
    for (size_t i = 0; i < av.size(); i++) EXPECT_NEAR(av[i], bv[i], 1e-15);
    auto bad = opt_a->state_dict();
    bad["5.exp_avg"] = Tensor::zeros({3}, DType::Float64);
    EXPECT_THROW(opt_b->load_state_dict(bad), Error);
    bad = opt_a->state_dict();
    bad.begin()->second = Tensor::zeros({4}, DType::Float64);  // "0.<buffer>": the wrong shape
    EXPECT_THROW(opt_b->load_state_dict(bad), Error);
  }
}

TEST(TorchOptim, Schedules) {
  Tensor p = Tensor::zeros({1}).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  optim::StepLR step(opt, 2, 0.5);
  std::vector<double> lrs;
  for (int e = 0; e < 5; e++) {
    step.step();
    lrs.push_back(opt.lr());
  }
  EXPECT_EQ(lrs, (std::vector<double>{1, 0.5, 0.5, 0.25, 0.25}));
  optim::SGD opt2({p}, {.lr = 1.0});
  optim::CosineAnnealingLR cos(opt2, 4, 0.0);
  cos.step();
  EXPECT_NEAR(opt2.lr(), (1 + std::cos(M_PI / 4)) / 2, 1e-15);
  for (int e = 0; e < 3; e++) cos.step();
  EXPECT_NEAR(opt2.lr(), 0, 1e-15);
  EXPECT_THROW(opt.set_lr(-1), Error);
  EXPECT_THROW(optim::SGD({Tensor::zeros({1})}, {}), Error);  // no gradient wanted
}

// Three Gaussian blobs in 8 dims, an MLP trained with SGD and momentum: the loss falls and the
// classifier separates them.
TEST(TorchTraining, AnMlpLearnsSeparableClasses) {
  Generator g(7);
  const int N = 240, D = 8, C = 3;
  Tensor centres = mul(Tensor::randn({C, D}, DType::Float32, g), 3.0);
  std::vector<int64_t> labels(N);
  for (int i = 0; i < N; i++) labels[i] = i % C;
  Tensor y = Tensor::from_vector(labels, {N});
  Tensor x = add(index_select(centres, 0, y), Tensor::randn({N, D}, DType::Float32, g));
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(D, 32, true, DType::Float32, g), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, C, true, DType::Float32, g)});
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::CrossEntropyLoss criterion;
  double first = 0, last = 0;
  for (int step = 0; step < 60; step++) {
    opt.zero_grad();
    Tensor loss = criterion((*net)(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, first / 10) << "loss " << first << " -> " << last;
  autograd::NoGradGuard no_grad;
  auto pred = argmax((*net)(x), 1).to_vector<int64_t>();
  int right = 0;
  for (int i = 0; i < N; i++) right += pred[i] == labels[i];
  EXPECT_GE(right, N * 95 / 100);
}

}  // namespace
