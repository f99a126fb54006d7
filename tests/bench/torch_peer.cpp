// libtorch's side of opforge bench's rows that have it as their peer (torch_peer.hpp).
#include "torch_peer.hpp"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <stdexcept>

namespace opforge::cli {

std::function<void()> torch_add_4(int threads) {
  torch::set_num_threads(threads);
  torch::manual_seed(4);
  auto a = std::make_shared<torch::Tensor>(torch::rand({4}, torch::kFloat32));
  auto b = std::make_shared<torch::Tensor>(torch::rand({4}, torch::kFloat32));
  auto c = std::make_shared<torch::Tensor>();
  // A result that does not match is a wrong peer, not a number to post.
  *c = torch::add(*a, *b);
  for (int i = 0; i < 4; i++)
    if (c->data_ptr<float>()[i] != a->data_ptr<float>()[i] + b->data_ptr<float>()[i])
      throw std::runtime_error("torch::add gave a wrong sum");
  return [a, b, c] { *c = torch::add(*a, *b); };
}

namespace {
// A normalisation's training step over x with gradient g: `forward` maps (x, weight, bias) to the
// result, the weight ones and the bias zeros of `features` elements; each call clears the three
// gradients, runs forward and backward. `y` receives the first step's result.
std::function<void()> norm_step(
    const std::vector<float>& x, const std::vector<float>& g, std::vector<int64_t> dims,
    int64_t features, int threads, std::vector<float>& y,
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>
        forward) {
  torch::set_num_threads(threads);
  struct State {
    torch::Tensor x, g, w, b, y;
  };
  auto s = std::make_shared<State>();
  s->x = torch::from_blob(const_cast<float*>(x.data()), dims).clone().requires_grad_();
  s->g = torch::from_blob(const_cast<float*>(g.data()), dims).clone();
  s->w = torch::ones({features}).requires_grad_();
  s->b = torch::zeros({features}).requires_grad_();
  auto step = [s, forward] {
    for (torch::Tensor* t : {&s->x, &s->w, &s->b}) t->mutable_grad() = torch::Tensor();
    s->y = forward(s->x, s->w, s->b);
    s->y.backward(s->g);
  };
  step();
  torch::Tensor yc = s->y.detach().contiguous();
  y.assign(yc.data_ptr<float>(), yc.data_ptr<float>() + yc.numel());
  return step;
}
}  // namespace

std::function<void()> torch_batch_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 4> shape, int threads,
                                            std::vector<float>& y) {
  const int64_t C = shape[1];
  auto rm = std::make_shared<torch::Tensor>(torch::zeros({C}));
  auto rv = std::make_shared<torch::Tensor>(torch::ones({C}));
  return norm_step(
      x, g, {shape.begin(), shape.end()}, C, threads, y,
      [rm, rv](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b) {
        return torch::batch_norm(in, w, b, *rm, *rv, true, 0.1, 1e-5, false);
      });
}

std::function<void()> torch_layer_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 2> shape, int threads,
                                            std::vector<float>& y) {
  const int64_t D = shape[1];
  return norm_step(x, g, {shape.begin(), shape.end()}, D, threads, y,
                   [D](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b) {
                     return torch::layer_norm(in, {D}, w, b, 1e-5);
                   });
}

std::function<void()> torch_max_pool2d_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 4> shape, int threads,
                                            std::vector<float>& y) {
  torch::set_num_threads(threads);
  struct State {
    torch::Tensor x, g, y;
  };
  auto s = std::make_shared<State>();
  s->x = torch::from_blob(const_cast<float*>(x.data()), {shape.begin(), shape.end()})
             .clone()
             .requires_grad_();
  const int64_t out[] = {shape[0], shape[1], shape[2] / 2, shape[3] / 2};
  s->g = torch::from_blob(const_cast<float*>(g.data()), out).clone();
  auto step = [s] {
    s->x.mutable_grad() = torch::Tensor();
    s->y = torch::max_pool2d(s->x, {2, 2});
    s->y.backward(s->g);
  };
  step();
  torch::Tensor yc = s->y.detach().contiguous();
  y.assign(yc.data_ptr<float>(), yc.data_ptr<float>() + yc.numel());
  return step;
}

}  // namespace opforge::cli
