// Calls the ops of my_ops.hpp through the opforge runtime, like built-ins, and checks them
// against a float64 reference. Exit status 0 means every check passed.
#include <cmath>
#include <cstdio>

#include "opforge/opforge.hpp"

int main() {
  using namespace opforge;
  Generator gen(7);
  Tensor x = Tensor::randn({3, 257}, DType::Float32, gen);
  auto xs = x.to_double_vector();
  int failures = 0;
  auto check = [&](const char* what, const Tensor& got, auto ref) {
    auto g = got.to_double_vector();
    double worst = 0;
    for (size_t i = 0; i < g.size(); i++)
      worst = std::max(worst, std::abs(g[i] - ref(i)) / (1 + std::abs(ref(i))));
    bool ok = worst < 1e-5;
    std::printf("%-12s %s (max rel. error %.2e over %zu values)\n", what, ok ? "ok" : "MISMATCH",
                worst, g.size());
    failures += !ok;
  };
  check("swish", elementwise("swish", {x}),
        [&](size_t i) { return xs[i] / (1 + std::exp(-xs[i])); });
  check("hard_tanh", elementwise("hard_tanh", {x}, {0.5}),
        [&](size_t i) { return std::fmin(std::fmax(xs[i], -0.5), 0.5); });
  check("sum_squares", reduction("sum_squares", x, {1}, false), [&](size_t row) {
    double s = 0;
    for (size_t j = 0; j < 257; j++) s += xs[row * 257 + j] * xs[row * 257 + j];
    return s;
  });
  for (const auto& v : op_info("swish").group("float32").variants)
    std::printf("swish variant: %s\n", v.name.c_str());
  return failures ? 1 : 0;
}
