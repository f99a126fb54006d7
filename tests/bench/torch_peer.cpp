// torch::add through libtorch for the dispatch benchmark (torch_peer.hpp).
#include "torch_peer.hpp"

#include <torch/torch.h>

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

std::function<void()> torch_batch_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 4> shape, int threads,
                                            std::vector<float>& y) {
  torch::set_num_threads(threads);
  const std::vector<int64_t> dims(shape.begin(), shape.end());
  const int64_t C = shape[1];
  struct State {
    torch::Tensor x, g, w, b, rm, rv, y;
  };
  auto s = std::make_shared<State>();
  s->x = torch::from_blob(const_cast<float*>(x.data()), dims).clone().requires_grad_();
  s->g = torch::from_blob(const_cast<float*>(g.data()), dims).clone();
  s->w = torch::ones({C}).requires_grad_();
  s->b = torch::zeros({C}).requires_grad_();
  s->rm = torch::zeros({C});
  s->rv = torch::ones({C});
  auto step = [s] {
    for (torch::Tensor* t : {&s->x, &s->w, &s->b}) t->mutable_grad() = torch::Tensor();
    s->y = torch::batch_norm(s->x, s->w, s->b, s->rm, s->rv, true, 0.1, 1e-5, false);
    s->y.backward(s->g);
  };
  step();
  torch::Tensor yc = s->y.detach().contiguous();
  y.assign(yc.data_ptr<float>(), yc.data_ptr<float>() + yc.numel());
  return step;
}

std::function<void()> torch_layer_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 2> shape, int threads,
                                            std::vector<float>& y) {
  torch::set_num_threads(threads);
  const std::vector<int64_t> dims(shape.begin(), shape.end());
  const int64_t D = shape[1];
  struct State {
    torch::Tensor x, g, w, b, y;
  };
  auto s = std::make_shared<State>();
  s->x = torch::from_blob(const_cast<float*>(x.data()), dims).clone().requires_grad_();
  s->g = torch::from_blob(const_cast<float*>(g.data()), dims).clone();
  s->w = torch::ones({D}).requires_grad_();
  s->b = torch::zeros({D}).requires_grad_();
  auto step = [s, D] {
    for (torch::Tensor* t : {&s->x, &s->w, &s->b}) t->mutable_grad() = torch::Tensor();
    s->y = torch::layer_norm(s->x, {D}, s->w, s->b, 1e-5);
    s->y.backward(s->g);
  };
  step();
  torch::Tensor yc = s->y.detach().contiguous();
  y.assign(yc.data_ptr<float>(), yc.data_ptr<float>() + yc.numel());
  return step;
}

}  // namespace opforge::cli
