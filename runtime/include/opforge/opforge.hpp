// Everything a program using opforge includes: tensors, ops, the registry and the dispatcher.
#pragma once
#include "opforge/dispatch.hpp"
#include "opforge/dtype.hpp"
#include "opforge/error.hpp"
#include "opforge/ops.hpp"
#include "opforge/registry.hpp"
#include "opforge/tensor.hpp"
