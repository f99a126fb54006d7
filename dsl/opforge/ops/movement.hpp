// Movement ops: the copies behind contiguous(), concat, pad, gather and its gradient, index_add.
// Views (reshape, transpose, slice, expand) need no kernel: the runtime changes strides.
#pragma once
#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;

inline const auto movement_ops =
    hana::make_tuple(movement("copy", MovementKind::copy, all_types),
                     movement("gather", MovementKind::gather, all_types),
                     movement("index_add", MovementKind::index_add, numeric));

}  // namespace opforge::ops
