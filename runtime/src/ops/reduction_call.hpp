// The reduction family's calls (reduction.cpp), for the ops elsewhere that run its kernels
// (batch_norm.cpp).
#pragma once
#include <utility>
#include <vector>

#include "opforge/ops.hpp"
#include "opforge/registry.hpp"

namespace opforge::detail {

// Runs a reduce or normalize op over `axes` of x: any set of axes becomes the canonical (inner,
// reduced, outer) view, permuting (and copying) only when they are not adjacent. `extra`: 1-D
// inputs of the reduced extent (layer_norm's weight and bias); `like`: inputs of x's shape that the
// kernel reads at x's view (a normalize op's gradient reads the result's gradient).
Tensor run_reduction(const OpInfo& op, Tensor x, std::vector<int> axes, bool keepdims,
                     const AttrValues& attrs, const std::vector<Tensor>& extra,
                     std::vector<Tensor> like = {});

// Runs a per_channel op (layer_norm_backward_reduce) or a channel_normalize op (batch_norm_train,
// batch_norm_backward) on x (N, C, ...) as the view (the dims after C, C, N): a channel_normalize
// op's result of x's shape first, then the per-channel results (C elements each). `like`: inputs
// of x's shape; `extra`: inputs of C elements.
std::vector<Tensor> run_per_channel(const OpInfo& op, const Tensor& x,
                                    const std::vector<Tensor>& like,
                                    const std::vector<Tensor>& extra, const AttrValues& attrs);

}  // namespace opforge::detail
