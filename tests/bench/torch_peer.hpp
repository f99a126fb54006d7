// libtorch as the peer of `opforge bench`'s rows that call PyTorch's own kernels: torch::add of two
// 4-element float32 tensors (the dispatch rows), training steps of batch_norm, layer_norm and
// max_pool2d. Built only where CMake
// finds Debian's libtorch-dev (OPFORGE_HAVE_LIBTORCH); kept in its own translation unit so that
// torch's headers and flags stay out of the rest of the command line.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

namespace opforge::cli {

// One torch::add(a, b) per call of the returned function, a and b made once; torch runs with
// `threads` intra-op threads (opforge's count), so both sides use the same cores.
std::function<void()> torch_add_4(int threads);

// One training step of batch normalisation per call: torch::batch_norm of x (N, C, H, W) with a
// weight, a bias and running statistics, then backward of g (x's, the weight's and the bias's
// gradients, set to none before each step). `y` receives the first step's result.
std::function<void()> torch_batch_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 4> shape, int threads,
                                            std::vector<float>& y);
// torch::layer_norm over the last dim of x (rows, D) with a weight and bias, then its backward
// with gradient g; y gets the first forward's result.
std::function<void()> torch_layer_norm_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 2> shape, int threads,
                                            std::vector<float>& y);

// torch::max_pool2d of x (N, C, H, W), 2x2 windows of stride 2, then its backward with gradient g
// (N, C, H / 2, W / 2); y gets the first forward's result.
std::function<void()> torch_max_pool2d_step(const std::vector<float>& x,
                                            const std::vector<float>& g,
                                            std::array<int64_t, 4> shape, int threads,
                                            std::vector<float>& y);

}  // namespace opforge::cli
