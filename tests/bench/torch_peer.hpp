// libtorch as the per-call peer of `opforge bench`'s dispatch rows: torch::add of two 4-element
// float32 tensors, the eager PyTorch C++ call a user would otherwise make. Built only where CMake
// finds Debian's libtorch-dev (OPFORGE_HAVE_LIBTORCH); kept in its own translation unit so that
// torch's headers and flags stay out of the rest of the command line.
#pragma once
#include <functional>

namespace opforge::cli {

// One torch::add(a, b) per call of the returned function, a and b made once; torch runs with
// `threads` intra-op threads (opforge's count), so both sides use the same cores.
std::function<void()> torch_add_4(int threads);

}  // namespace opforge::cli
