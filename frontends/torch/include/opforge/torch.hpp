// opforge::torch: the PyTorch-style C++ API (functional, nn, optim, data-parallel training) over
// opforge's ops and autograd.
#pragma once
#include "opforge/autograd.hpp"
#include "opforge/torch/functional.hpp"
#include "opforge/torch/nn.hpp"
#include "opforge/torch/optim.hpp"
#include "opforge/torch/parallel.hpp"
