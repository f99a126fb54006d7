// The float64 MLP (12 -> 16 -> ReLU -> 5) the data-parallel and distributed tests train, so that
// their results can be compared to rounding with one backward pass over the whole batch.
#pragma once
#include <memory>

#include "opforge/torch/nn.hpp"

namespace opforge {

inline std::shared_ptr<torch::nn::Sequential> small_mlp(uint64_t seed) {
  Generator g(seed);
  return std::make_shared<torch::nn::Sequential>(
      std::initializer_list<std::shared_ptr<torch::nn::Module>>{
          std::make_shared<torch::nn::Linear>(12, 16, true, DType::Float64, g),
          std::make_shared<torch::nn::ReLU>(),
          std::make_shared<torch::nn::Linear>(16, 5, true, DType::Float64, g)});
}

}  // namespace opforge
