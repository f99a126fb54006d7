// Quickstart: the first opforge program to read. It makes tensors, runs a few ops (on a GPU too,
// when there is one), prints small results, and shows which kernel variant the dispatcher settled
// on for each op.
#include <cstdio>
#include <iostream>
#include <map>

#include "opforge/device.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/ops.hpp"

using opforge::DType;
using opforge::Tensor;

int main() {
  try {
    // A seeded generator gives the same numbers on every machine.
    opforge::Generator gen(42);

    // add broadcasts NumPy-style: the [3] row is added to each row of the [2, 3] matrix.
    const Tensor x = Tensor::randn({2, 3}, DType::Float32, gen);
    const Tensor row = Tensor::from_vector<float>({1, 2, 3});
    const Tensor y = opforge::add(x, row);
    std::cout << "x + [1, 2, 3] =\n" << y.str() << "\n\n";

    const Tensor w = Tensor::randn({3, 4}, DType::Float32, gen);
    const Tensor logits = opforge::matmul(y, w);  // [2, 3] @ [3, 4] -> [2, 4]
    std::cout << "matmul ->\n" << logits.str() << "\n\n";

    const Tensor probs = opforge::softmax(logits, -1);
    std::cout << "softmax over the last axis ->\n" << probs.str() << "\n\n";
    // Each row of a softmax sums to 1, which makes a handy check of the reduction.
    std::cout << "sum over axis 1 ->\n" << opforge::sum(probs, {1}).str() << "\n\n";

    // A 3x3 box filter of ones over a 5x5 ramp: padding 1 keeps the 5x5 size, and each output is
    // the sum of the input's 3x3 neighbourhood.
    const Tensor image = Tensor::arange(0, 25).reshape({1, 1, 5, 5});
    const Tensor box = Tensor::ones({1, 1, 3, 3});
    opforge::Conv2dOptions conv;
    conv.padding = {1, 1};
    const Tensor blurred = opforge::conv2d(image, box, {}, conv);
    std::cout << "conv2d 3x3 box, padding 1 ->\n" << blurred.str() << "\n\n";

    // On a GPU when there is one (an OpenCL device such as PoCL's counts): tensors moved there
    // stay there, ops on them run there, and reading the result copies it back.
    for (opforge::DeviceKind kind : {opforge::DeviceKind::cuda, opforge::DeviceKind::opencl}) {
      const opforge::Device gpu{kind, 0};
      if (!opforge::device_exists(gpu)) continue;
      const Tensor p = opforge::softmax(opforge::matmul(y.to(gpu), w.to(gpu)), -1);
      std::cout << "the same softmax on " << p.device().str() << " ->\n" << p.str() << "\n\n";
      break;
    }

    // The dispatcher times the eligible variants on the first calls of each shape, then keeps
    // the fastest; a short loop lets it get there, as a model's inference loop would.
    for (int i = 0; i < 50; ++i) {
      opforge::softmax(opforge::matmul(opforge::add(x, row), w), -1);
      opforge::conv2d(image, box, {}, conv);
    }

    // Per (op, dtype) the variant with the most calls is the one in use; the others were timed
    // while calibrating. OPFORGE_VARIANT=manual (or opforge::force_variant) pins one instead.
    std::map<std::string, opforge::DispatchStat> chosen;
    std::cout << "dispatch statistics:\n";
    for (const opforge::DispatchStat& s : opforge::dispatch_stats()) {
      std::printf("  %-10s %-8s %-20s %6lld calls  %9.2f us/call\n", s.op.c_str(), s.dtype.c_str(),
                  s.variant.c_str(), static_cast<long long>(s.calls), s.mean_seconds * 1e6);
      opforge::DispatchStat& best = chosen[s.op + " " + s.dtype];
      if (s.calls > best.calls) best = s;
    }
    std::cout << "\nchosen variants:\n";
    for (const auto& [key, s] : chosen) std::cout << "  " << key << ": " << s.variant << '\n';
    return 0;
  } catch (const opforge::Error& e) {
    std::cerr << "quickstart: " << e.what() << '\n';
    return 1;
  }
}
