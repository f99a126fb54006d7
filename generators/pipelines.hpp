// Turns a DSL op at one dtype into a Halide pipeline over its family's canonical view: the
// kernel's arguments (inputs, attributes, output), the Funcs a schedule works on, and the
// estimates an autoscheduler needs. Each family's canonical extents ("call extents") are what the
// runtime passes when it asks whether a variant may run a call.
// Each family's builder is in generators/pipeline_<family>.hpp.
#pragma once
#include "generators/pipeline_contraction.hpp"
#include "generators/pipeline_elementwise.hpp"
#include "generators/pipeline_movement.hpp"
#include "generators/pipeline_reduction.hpp"
#include "generators/pipeline_window.hpp"
