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

}  // namespace opforge::cli
