// Everything a program using opforge includes: tensors, ops, autograd, devices, the registry and
// the dispatcher.
#pragma once
#include "opforge/autograd.hpp"
#include "opforge/device.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/dtype.hpp"
#include "opforge/error.hpp"
#include "opforge/ops.hpp"
#include "opforge/registry.hpp"
#include "opforge/safetensors.hpp"
#include "opforge/tensor.hpp"
