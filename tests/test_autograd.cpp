// Autograd: every recorded op's gradient against central finite differences of the same function
// in float64 (gradcheck, as torch.autograd.gradcheck), and the tape's rules: accumulation,
// no_grad, detach, retain_graph, autograd::grad, retain_grad, in-place ops and their version
// counters, and the errors.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;
using autograd::NoGradGuard;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor randn64(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return Tensor::randn(s, DType::Float64, g);
}

// <f(inputs), w> for fixed random weights w: a scalar whose gradient is every output's.
double weighted(const Fn& f, const std::vector<Tensor>& in, const Tensor& w) {
  return sum(mul(f(in), w)).item();
}

// Checks autograd's gradient of <f(inputs), w> against central differences (step 1e-6) at every
// element of every input that requires a gradient. Inputs are float64.
void gradcheck(const Fn& f, std::vector<Tensor> inputs, double tol = 1e-6) {
  for (Tensor& t : inputs) ASSERT_EQ(t.dtype(), DType::Float64);
  Tensor y = f(inputs);
  Tensor w = randn64(y.shape(), 99);
  sum(mul(y, w)).backward();
  const double h = 1e-6;
  for (size_t i = 0; i < inputs.size(); i++) {
    if (!inputs[i].requires_grad()) continue;
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(inputs[i].grad().defined());
    ASSERT_EQ(inputs[i].grad().shape(), inputs[i].shape());
    std::vector<double> analytic = inputs[i].grad().to_double_vector();
    std::vector<double> x = inputs[i].to_double_vector();
    NoGradGuard no_grad;
    for (size_t j = 0; j < x.size(); j++) {
      std::vector<Tensor> plus = inputs, minus = inputs;
      std::vector<double> xp = x, xm = x;
      xp[j] += h;
      xm[j] -= h;
      plus[i] = Tensor::from_vector(xp, inputs[i].shape());
      minus[i] = Tensor::from_vector(xm, inputs[i].shape());
      double numeric = (weighted(f, plus, w) - weighted(f, minus, w)) / (2 * h);
      EXPECT_NEAR(analytic[j], numeric, tol * (1 + std::abs(numeric))) << "element " << j;
    }
  }
}

Tensor leaf(const Shape& s, uint64_t seed) { return randn64(s, seed).requires_grad_(); }

TEST(Autograd, ElementwiseChainsWithBroadcasting) {
  gradcheck(
      [](const std::vector<Tensor>& in) {
        const Tensor &a = in[0], &b = in[1];
        Tensor d = add(mul(b, b), 1.0);
        return add(sub(add(mul(a, b), exp(a)), div(a, d)), tanh(a));
      },
      {leaf({3, 4}, 1), leaf({4}, 2)});
}

TEST(Autograd, UnaryOpsGoThroughTheirBackwardKernels) {
  // Away from kinks: random normal values are not at 0 or at the clip bounds.
  gradcheck(
      [](const std::vector<Tensor>& in) {
        const Tensor& x = in[0];
        Tensor s = add(add(sigmoid(x), gelu(x)), softplus(x));
        s = add(s, log(add(abs(x), 1.0)));
        s = add(s, sqrt(add(mul(x, x), 1.0)));
        s = add(s, add(leaky_relu(x, 0.1), elu(x, 0.5)));
        s = add(s, add(clip(x, -0.7, 0.9), erf(x)));
        s = add(s, add(sin(x), cos(x)));
        return add(s, pow(add(abs(x), 0.5), 1.5));
      },
      {leaf({2, 5}, 3)});
}

TEST(Autograd, TensorsUsedTwiceAccumulate) {
  Tensor x = leaf({5}, 4);
  gradcheck([](const std::vector<Tensor>& in) { return add(mul(in[0], in[0]), in[0]); }, {x});
  // d/dx sum(x*x + x) . w = (2x + 1) w: and a second backward adds to grad()
  Tensor g1 = x.grad().clone();
  sum(x).backward();
  auto a = g1.to_double_vector(), b = x.grad().to_double_vector();
  for (size_t i = 0; i < a.size(); i++) EXPECT_DOUBLE_EQ(b[i], a[i] + 1);
}

TEST(Autograd, Matmul) {
  auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  gradcheck(mm, {leaf({3, 4}, 5), leaf({4, 5}, 6)});
  gradcheck(mm, {leaf({2, 3, 4}, 7), leaf({4, 5}, 8)});         // batch broadcast
  gradcheck(mm, {leaf({2, 1, 3, 4}, 9), leaf({5, 4, 2}, 10)});  // both broadcast
  gradcheck(mm, {leaf({4}, 11), leaf({4, 5}, 12)});
  gradcheck(mm, {leaf({3, 4}, 13), leaf({4}, 14)});
  gradcheck(mm, {leaf({4}, 15), leaf({4}, 16)});
}

TEST(Autograd, Gemm) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::to_string(ta) + std::to_string(tb));
      Shape sa = ta ? Shape{4, 3} : Shape{3, 4}, sb = tb ? Shape{5, 4} : Shape{4, 5};
      gradcheck(
          [ta, tb](const std::vector<Tensor>& in) {
            return gemm(in[0], in[1], in[2], 0.5, 2.0, ta, tb);
          },
          {leaf(sa, 17), leaf(sb, 18), leaf({5}, 19)});
    }
  gradcheck([](const std::vector<Tensor>& in) { return gemm(in[0], in[1]); },
            {leaf({3, 4}, 20), leaf({4, 2}, 21)});
}

TEST(Autograd, Linear) {
  for (opforge::Activation act : {opforge::Activation::none, opforge::Activation::relu}) {
    SCOPED_TRACE(act == opforge::Activation::relu ? "relu" : "none");
    auto lin = [act](const std::vector<Tensor>& in) {
      return linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), act);
    };
    gradcheck(lin, {leaf({3, 4}, 40), leaf({5, 4}, 41), leaf({5}, 42)});
    gradcheck(lin, {leaf({2, 3, 4}, 43), leaf({5, 4}, 44)});  // batch dims, no bias
    gradcheck(lin, {leaf({4}, 45), leaf({5, 4}, 46), leaf({5}, 47)});
    // The data needs no gradient (a first layer): only the weight's and the bias's are made.
    Tensor x = randn64({3, 4}, 48), w = leaf({5, 4}, 49), b = leaf({5}, 50);
    gradcheck(lin, {x, w, b});
    EXPECT_FALSE(x.grad().defined());
  }
}

TEST(Autograd, CrossEntropyAgainstTargetDistributions) {
  auto ce = [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); };
  // Gradients for the scores and for the target distribution (PyTorch gives both).
  gradcheck(ce, {leaf({4, 5}, 60), softmax(randn64({4, 5}, 61), 1).requires_grad_()});
  gradcheck(ce, {leaf({3, 7}, 62), softmax(randn64({3, 7}, 63), 1)});
}

TEST(Autograd, Reductions) {
  Tensor x = leaf({3, 4}, 22);
  gradcheck([](const std::vector<Tensor>& in) { return sum(in[0], {1}); }, {x});
  gradcheck([](const std::vector<Tensor>& in) { return mean(in[0], {0}, true); },
            {leaf({3, 4}, 23)});
  gradcheck([](const std::vector<Tensor>& in) { return mean(in[0]); }, {leaf({3, 4}, 24)});
  gradcheck([](const std::vector<Tensor>& in) { return max(in[0], {1}); }, {leaf({3, 4}, 25)});
  gradcheck([](const std::vector<Tensor>& in) { return min(in[0], {0}); }, {leaf({3, 4}, 26)});
  gradcheck([](const std::vector<Tensor>& in) { return logsumexp(in[0], {1}); },
            {leaf({3, 4}, 27)});
  gradcheck([](const std::vector<Tensor>& in) { return var(in[0], {1}, false, 1); },
            {leaf({3, 4}, 28)});
  gradcheck([](const std::vector<Tensor>& in) { return prod(in[0], {1}); }, {leaf({3, 4}, 29)});
  gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {leaf({3, 4}, 30)});
  gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); },
            {leaf({3, 4}, 31)});
  gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}, in[1], in[2], 1e-5); },
      {leaf({3, 4}, 32), leaf({4}, 33), leaf({4}, 34)});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {2, 3});
      },
      {leaf({2, 2, 3}, 35)});
  // Axes that are not adjacent, every axis, and a 0-d input: the backward ops' other paths.
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return max(in[0], {0, 2});
      },
      {leaf({3, 4, 2}, 36)});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return var(in[0], {0, 2}, true, 0);
      },
      {leaf({3, 4, 2}, 37)});
  gradcheck([](const std::vector<Tensor>& in) { return logsumexp(in[0]); }, {leaf({3, 4}, 38)});
  gradcheck([](const std::vector<Tensor>& in) { return min(in[0]); }, {leaf({}, 39)});
}

// autograd::function: the caller's own backward, recorded on the result; a backward that gives
// the wrong number of gradients, or one of the wrong shape, is an Error naming the function.
TEST(Autograd, CustomFunctionsRecordTheirBackward) {
  Tensor x = Tensor::from_vector(std::vector<double>{1.5, -2.0, 3.0}).requires_grad_();
  auto cube = [&](auto backward) {
    return autograd::function(
        "cube", {x}, [&] { return mul(mul(x, x), x); }, backward);
  };
  Tensor y = cube([xd = x.detach()](const Tensor& g) {
    return std::vector<Tensor>{mul(mul(mul(xd, xd), 3.0), g)};
  });
  EXPECT_TRUE(y.requires_grad());
  sum(y).backward();
  const std::vector<double> got = x.grad().to_vector<double>();
  const std::vector<double> want{6.75, 12.0, 27.0};
  for (size_t i = 0; i < want.size(); i++) EXPECT_DOUBLE_EQ(got[i], want[i]) << i;
  Tensor two = cube([](const Tensor& g) { return std::vector<Tensor>{g, g}; });
  EXPECT_THROW(sum(two).backward(), Error);
  Tensor shape = cube([](const Tensor& g) { return std::vector<Tensor>{sum(g)}; });
  try {
    sum(shape).backward();
    ADD_FAILURE() << "a gradient of the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cube"), std::string::npos) << e.what();
  }
  {
    NoGradGuard no_grad;  // nothing recorded: the forward alone
    EXPECT_FALSE(cube([](const Tensor& g) { return std::vector<Tensor>{g}; }).requires_grad());
  }
}

TEST(Autograd, MaxSharesTiesEvenly) {
  Tensor x = Tensor::from_vector<double>({1, 3, 3, 2}, {4}).requires_grad_();
  max(x).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{0, 0.5, 0.5, 0}));
}

// A NaN maximum's gradient is shared among the NaNs, as torch.max(x) without a dim does (amax over
// dims would make the row NaN).
TEST(Autograd, MaxOfNaNsGoesToTheNaNs) {
  Tensor x = Tensor::from_vector<double>({1, NAN, NAN, 3, 2, 4}, {2, 3}).requires_grad_();
  max(x, {1}).backward(Tensor::from_vector<double>({2, 6}, {2}));
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{0, 1, 1, 0, 0, 6}));
}

TEST(Autograd, ZeroGradientOps) {
  Tensor x = Tensor::from_vector<double>({-1.5, 0.25, 2.5}, {3}).requires_grad_();
  sum(add(add(floor(x), round(x)), add(sign(x), x))).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{1, 1, 1}));
}

TEST(Autograd, Views) {
  auto check = [](const Fn& f, const Shape& s) { gradcheck(f, {leaf(s, 36)}); };
  check([](const std::vector<Tensor>& in) { return mul(in[0].reshape({4, 3}), 2.0); }, {3, 4});
  check([](const std::vector<Tensor>& in) { return in[0].transpose(0, 1).contiguous(); }, {3, 4});
  check(
      [](const std::vector<Tensor>& in) {
        return mul(in[0].permute({2, 0, 1}), 3.0);
      },
      {2, 3, 4});
  check([](const std::vector<Tensor>& in) { return mul(in[0].slice(1, 1, 6, 2), 1.0); }, {3, 6});
  check([](const std::vector<Tensor>& in) { return mul(in[0].select(0, -1), 1.0); }, {3, 4});
  check([](const std::vector<Tensor>& in) { return mul(in[0].expand({2, 3, 4}), 1.0); }, {3, 1});
  check([](const std::vector<Tensor>& in) { return in[0].unsqueeze(1).squeeze(1).view({12}); },
        {3, 4});
  check([](const std::vector<Tensor>& in) { return pad(in[0], {{1, 0}, {0, 2}}, 5.0); }, {2, 3});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return concat({in[0], in[1], in[0]}, 1);
      },
      {leaf({2, 3}, 37), leaf({2, 1}, 38)});
}

TEST(Autograd, CastsAndMixedDtypesGiveEachInputItsOwnDtype) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3}).requires_grad_();
  Tensor b = Tensor::from_vector<double>({4, 5, 6}, {3}).requires_grad_();
  sum(mul(a, b)).backward();
  EXPECT_EQ(a.grad().dtype(), DType::Float32);
  EXPECT_EQ(a.grad().to_double_vector(), (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(b.grad().to_double_vector(), (std::vector<double>{1, 2, 3}));
  Tensor c = Tensor::from_vector<float>({1, 2}, {2}).requires_grad_();
  sum(mul(c.to(DType::Float64), 3.0)).backward();
  EXPECT_EQ(c.grad().dtype(), DType::Float32);
  EXPECT_EQ(c.grad().to_double_vector(), (std::vector<double>{3, 3}));
  // an integer operand gets no gradient and does not stop its float partner's
  Tensor i = Tensor::from_vector<int64_t>({2, 3}, {2});
  Tensor d = Tensor::from_vector<float>({1, 1}, {2}).requires_grad_();
  sum(mul(d, i)).backward();
  EXPECT_EQ(d.grad().to_double_vector(), (std::vector<double>{2, 3}));
}

TEST(Autograd, TwoLayerClassifierLoss) {
  // cross-entropy by log_softmax against one-hot targets: the training path of an MLP
  Tensor x = randn64({4, 6}, 40);
  Tensor onehot = Tensor::zeros({4, 3}, DType::Float64);
  for (int r = 0; r < 4; r++) onehot.select(0, r).select(0, r % 3).fill_(1);
  gradcheck(
      [&](const std::vector<Tensor>& p) {
        Tensor h = relu(add(matmul(x, p[0]), p[1]));
        Tensor logits = add(matmul(h, p[2]), p[3]);
        return neg(mean(sum(mul(onehot, log_softmax(logits, 1)), {1})));
      },
      {leaf({6, 5}, 41), leaf({5}, 42), leaf({5, 3}, 43), leaf({3}, 44)});
}

TEST(Autograd, NoGradDetachAndRequiresGrad) {
  Tensor x = leaf({3}, 50);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_TRUE(x.requires_grad());
  Tensor y = mul(x, 2.0);
  EXPECT_FALSE(y.is_leaf());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "mul");
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(mul(x, 2.0).requires_grad());
  }
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage(), x.storage());
  EXPECT_THROW(sum(mul(d, 2.0)).backward(), Error);
  EXPECT_FALSE(eq(x, 0.0).requires_grad());  // bool results carry no gradient
  EXPECT_FALSE(argmax(x).requires_grad());
  EXPECT_THROW(Tensor::zeros({2}, DType::Int64).requires_grad_(), Error);
  EXPECT_THROW(y.requires_grad_(false), Error);
  // grad mode is per thread
  NoGradGuard no_grad;
  bool other = false;
  std::thread([&] { other = mul(x, 2.0).requires_grad(); }).join();
  EXPECT_TRUE(other);
  EXPECT_FALSE(mul(x, 2.0).requires_grad());
}

TEST(Autograd, RetainGraphAndSecondBackward) {
  Tensor x = leaf({3}, 51);
  Tensor loss = sum(exp(x));
  loss.backward({}, true);
  auto first = x.grad().to_double_vector();
  loss.backward();
  auto second = x.grad().to_double_vector();
  for (size_t i = 0; i < first.size(); i++) EXPECT_DOUBLE_EQ(second[i], 2 * first[i]);
  try {
    loss.backward();
    FAIL() << "a third backward through a freed graph must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, GradReturnsWithoutAccumulating) {
  Tensor x = leaf({3}, 52), u = leaf({2}, 53);
  Tensor y = mul(x, x);
  auto g = autograd::grad({sum(y)}, {x, y}, {}, true);
  ASSERT_EQ(g.size(), 2u);
  auto xv = x.to_double_vector(), gx = g[0].to_double_vector();
  for (size_t i = 0; i < xv.size(); i++) EXPECT_DOUBLE_EQ(gx[i], 2 * xv[i]);
  EXPECT_EQ(g[1].to_double_vector(), (std::vector<double>{1, 1, 1}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_THROW(autograd::grad({sum(mul(x, x))}, {u}), Error);
  auto unused = autograd::grad({sum(mul(x, x))}, {u}, {}, false, true);
  EXPECT_FALSE(unused[0].defined());
}

TEST(Autograd, RetainGradKeepsANonLeafsGradient) {
  Tensor x = leaf({3}, 54);
  Tensor y = mul(x, 2.0);
  y.retain_grad();
  sum(mul(y, y)).backward();
  auto yv = y.to_double_vector(), gy = y.grad().to_double_vector();
  for (size_t i = 0; i < yv.size(); i++) EXPECT_DOUBLE_EQ(gy[i], 2 * yv[i]);
}

TEST(Autograd, NonScalarBackwardNeedsAGradientOfItsShape) {
  Tensor x = leaf({3}, 55);
  Tensor y = mul(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  EXPECT_THROW(y.backward(Tensor::ones({2}, DType::Float64)), Error);
  y.backward(Tensor::from_vector<double>({1, 2, 3}, {3}));
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{2, 4, 6}));
}

TEST(Autograd, InPlaceOpsTakeHistoryAndVersionCountersCatchStaleSaves) {
  Tensor x = leaf({3}, 56);
  Tensor y = mul(x, 2.0);
  y.mul_(3.0).add_(1.0);
  EXPECT_EQ(y.grad_fn()->name(), "add");
  sum(y).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{6, 6, 6}));
  // y2 is saved by mul(y2, y2); writing it afterwards makes that gradient stale
  Tensor y2 = mul(x, 2.0);
  Tensor z = mul(y2, y2);
  uint32_t v = y2.version();
  y2.add_(1.0);
  EXPECT_GT(y2.version(), v);
  try {
    sum(z).backward();
    FAIL() << "a stale saved tensor must fail backward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("written in place"), std::string::npos) << e.what();
  }
  // in-place on a leaf that requires a gradient: refused, except under no_grad (optimisers)
  EXPECT_THROW(x.add_(1.0), Error);
  {
    NoGradGuard no_grad;
    x.add_(1.0);
  }
  // out= records nothing, so it is refused when an input requires a gradient
  Tensor out = Tensor::empty({3}, DType::Float64);
  EXPECT_THROW(add_out(out, x, x), Error);
  // a plain tensor written from one that requires a gradient takes its history
  Tensor buf = Tensor::zeros({3}, DType::Float64);
  buf.copy_(x);
  EXPECT_TRUE(buf.requires_grad());
  x.set_grad({});
  sum(mul(buf, buf)).backward();
  auto xv = x.to_double_vector(), gx = x.grad().to_double_vector();
  for (size_t i = 0; i < xv.size(); i++) EXPECT_DOUBLE_EQ(gx[i], 2 * xv[i]);
  // ... but not into a view of a larger tensor
  Tensor big = Tensor::zeros({6}, DType::Float64);
  EXPECT_THROW(big.slice(0, 0, 3).copy_(x), Error);
}

TEST(Autograd, AViewOfATensorWrittenInPlaceSinceIsRefused) {
  Tensor a = leaf({4}, 60);
  Tensor z = mul(a, 2.0);
  Tensor v = z.view({2, 2});
  z.mul_(3.0);  // z has a new history; v still leads to the old one
  EXPECT_THROW(sum(v).backward(), Error);
  Tensor v2 = z.view({2, 2});  // made after the write: fine, and through both writes
  sum(v2).backward();
  EXPECT_EQ(a.grad().to_double_vector(), (std::vector<double>{6, 6, 6, 6}));
}

TEST(Autograd, RetainedGradientsFollowInPlaceWritesAndOwnTheirMemory) {
  Tensor x = leaf({3}, 61);
  Tensor y = mul(x, 1.0);
  y.retain_grad();
  y.mul_(3.0);
  sum(y).backward();
  EXPECT_EQ(y.grad().to_double_vector(), (std::vector<double>{1, 1, 1}));
  y.grad().zero_();  // not an expanded view of sum's gradient
  EXPECT_EQ(y.grad().to_double_vector(), (std::vector<double>{0, 0, 0}));
  // the caller's root gradient is not kept as grad(), nor its history
  Tensor r = leaf({3}, 62);
  Tensor w = mul(x, 2.0);
  w.retain_grad();
  w.backward(r);
  EXPECT_FALSE(w.grad().requires_grad());
  EXPECT_NE(w.grad().storage(), r.storage());
}

TEST(Autograd, ToTheSameDeviceKeepsALeaf) {
  Tensor w = leaf({2}, 63);
  Tensor same = w.to(Device{});
  EXPECT_TRUE(same.is_leaf());
  sum(mul(same, 2.0)).backward();
  EXPECT_EQ(w.grad().to_double_vector(), (std::vector<double>{2, 2}));
}

TEST(Autograd, OverwritingANonLeafWithAConstantKeepsItInTheGraph) {
  Tensor x = leaf({3}, 64);
  Tensor y = mul(x, 2.0);
  y.zero_();
  EXPECT_TRUE(y.requires_grad());
  sum(add(y, x)).backward();  // only the direct path counts
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{1, 1, 1}));
}

TEST(Autograd, ReductionsOfAZeroDimInput) {
  Tensor x = Tensor::scalar(3, DType::Float64).requires_grad_();
  mean(x, {0}).backward();
  EXPECT_EQ(x.grad().item(), 1);
  x.set_grad({});
  var(x, {0}, false, 0).backward();
  EXPECT_EQ(x.grad().item(), 0);
}

TEST(Autograd, GradRunsOnlyWhatItsInputsNeed) {
  // the other branch's saved tensor is stale: backward() fails through it, grad() of x does not
  // go there
  Tensor x = leaf({3}, 65), u = leaf({3}, 66);
  Tensor t = mul(u, 2.0);
  Tensor side = mul(t, t);
  t.add_(1.0);
  Tensor out = add(sum(mul(x, x)), sum(side));
  EXPECT_THROW(out.backward({}, true), Error);
  auto g = autograd::grad({out}, {x});
  auto xv = x.to_double_vector(), gx = g[0].to_double_vector();
  for (size_t i = 0; i < 3; i++) EXPECT_DOUBLE_EQ(gx[i], 2 * xv[i]);
}

TEST(Autograd, OpsWithoutAGradientSayWhenAnInputNeedsOne) {
  Tensor x = randn64({1, 1, 4, 4}, 57).requires_grad_();
  try {
    sincos(x);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no gradient yet"), std::string::npos) << e.what();
  }
  // The window ops' gradients are first-order: a gradient that itself requires one is refused.
  Tensor w = randn64({1, 1, 3, 3}, 58);
  EXPECT_THROW(conv2d_backward_input(randn64({1, 1, 2, 2}, 59).requires_grad_(), w, {1, 1, 4, 4}),
               Error);
  NoGradGuard no_grad;  // without recording they run
  EXPECT_EQ(sincos(x).first.shape(), x.shape());
}

// conv2d's gradients (conv2d_backward_input, conv2d_backward_weight and a sum for the bias)
// against finite differences: padding, stride, dilation, groups, a strided input view, and a
// first layer whose input needs no gradient.
TEST(Autograd, Convolution) {
  auto conv = [](Conv2dOptions o) -> Fn {
    return [o](const std::vector<Tensor>& in) {
      return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), o);
    };
  };
  gradcheck(conv({}), {leaf({2, 3, 6, 5}, 60), leaf({4, 3, 3, 3}, 61), leaf({4}, 62)});
  Conv2dOptions s;
  s.stride = {2, 1};
  s.padding = {1, 2};
  s.dilation = {1, 2};
  gradcheck(conv(s), {leaf({1, 2, 7, 8}, 63), leaf({3, 2, 3, 2}, 64), leaf({3}, 65)});
  Conv2dOptions grouped;
  grouped.groups = 2;
  grouped.padding = {1, 1};
  grouped.stride = {2, 2};
  gradcheck(conv(grouped), {leaf({2, 4, 5, 5}, 66), leaf({6, 2, 3, 3}, 67)});
  gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0].transpose(2, 3), in[1], {}, Conv2dOptions{{1, 1}, {1, 0}});
      },
      {leaf({1, 2, 6, 4}, 68), leaf({2, 2, 3, 3}, 69)});
  Tensor data = randn64({2, 3, 5, 5}, 70), w = leaf({2, 3, 3, 3}, 71);
  gradcheck(conv({}), {data, w});
  EXPECT_FALSE(data.grad().defined());
}

TEST(Autograd, ConvTranspose) {
  auto convt = [](ConvTranspose2dOptions o) -> Fn {
    return [o](const std::vector<Tensor>& in) {
      return conv_transpose2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), o);
    };
  };
  gradcheck(convt({}), {leaf({2, 3, 4, 5}, 72), leaf({3, 2, 3, 3}, 73), leaf({2}, 74)});
  ConvTranspose2dOptions o;
  o.stride = {2, 3};
  o.padding = {1, 1};
  o.output_padding = {1, 2};
  o.groups = 2;
  gradcheck(convt(o), {leaf({1, 4, 3, 4}, 75), leaf({4, 3, 3, 4}, 76)});
}

TEST(Autograd, Pools) {
  auto pool = [](bool is_max, Pool2dOptions o) -> Fn {
    return [=](const std::vector<Tensor>& in) {
      return is_max ? max_pool2d(in[0], o) : avg_pool2d(in[0], o);
    };
  };
  Pool2dOptions tiling;  // 2x2, stride 2, as a CNN uses it
  Pool2dOptions overlapping;
  overlapping.kernel = {3, 3};
  overlapping.stride = {2, 1};
  overlapping.padding = {1, 1};
  for (bool is_max : {true, false}) {
    SCOPED_TRACE(is_max ? "max_pool2d" : "avg_pool2d");
    gradcheck(pool(is_max, tiling), {leaf({2, 3, 6, 5}, 77)});
    gradcheck(pool(is_max, overlapping), {leaf({2, 2, 5, 6}, 78)});
    Pool2dOptions exclude = overlapping;
    exclude.count_include_pad = false;
    gradcheck(pool(is_max, exclude), {leaf({1, 2, 5, 6}, 79)});
  }
}

// index_select and gather add their gradient back with index_add (repeated indices add up);
// index_add's source gets index_select of the gradient.
TEST(Autograd, IndexSelectGatherAndIndexAdd) {
  Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2, -1}, {4});
  gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], 1, idx); },
            {leaf({3, 4, 2}, 80)});
  gradcheck([&](const std::vector<Tensor>& in) { return index_select(in[0], 0, idx); },
            {leaf({5, 3}, 81)});
  Tensor idx2 = Tensor::from_vector<int64_t>({1, 1, 0, 3, 2, 1}, {2, 3});
  gradcheck([&](const std::vector<Tensor>& in) { return gather(in[0], 0, idx2); },
            {leaf({4, 3}, 82)});
  gradcheck([&](const std::vector<Tensor>& in) { return index_add(in[0], 1, idx, in[1], 0.5); },
            {leaf({3, 4, 2}, 83), leaf({3, 4, 2}, 84)});
}

// max_pool2d's gradient goes where PyTorch's indices point: to the first maximum of a window.
TEST(Autograd, MaxPoolTiesGoToTheFirstMaximum) {
  Tensor x = Tensor::from_vector<double>({1, 3, 3, 0}, {1, 1, 2, 2}).requires_grad_();
  Pool2dOptions o;
  sum(max_pool2d(x, o)).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{0, 1, 0, 0}));
}

}  // namespace
