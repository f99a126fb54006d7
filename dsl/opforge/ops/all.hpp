// The op table of the built-in library: every family's ops, as one compile-time list per family.
#pragma once
#include "opforge/ops/contraction.hpp"
#include "opforge/ops/elementwise.hpp"
#include "opforge/ops/movement.hpp"
#include "opforge/ops/reduction.hpp"
#include "opforge/ops/window.hpp"

namespace opforge::ops {
inline const auto all_ops = hana::concat(
    hana::concat(hana::concat(hana::concat(elementwise_ops, reduction_ops), contraction_ops),
                 window_ops),
    movement_ops);
}  // namespace opforge::ops
