// A program of its own that links the installed opforge static library: a small MLP layer
// forward pass (matmul, bias, gelu, softmax), checked against a float64 computation.
#include <cmath>
#include <cstdio>

#include "opforge/opforge.hpp"

int main() {
  using namespace opforge;
  Generator gen(42);
  Tensor x = Tensor::randn({16, 64}, DType::Float32, gen);
  Tensor w = Tensor::randn({64, 10}, DType::Float32, gen);
  Tensor b = Tensor::randn({10}, DType::Float32, gen);
  Tensor y = softmax(gelu(add(matmul(x, w), b)), -1);

  auto xv = x.to_double_vector(), wv = w.to_double_vector(), bv = b.to_double_vector(),
       yv = y.to_double_vector();
  double worst = 0;
  for (int i = 0; i < 16; i++) {
    double h[10], total = 0, mx = -INFINITY;
    for (int j = 0; j < 10; j++) {
      double s = bv[j];
      for (int k = 0; k < 64; k++) s += xv[i * 64 + k] * wv[k * 10 + j];
      h[j] = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0)));
      mx = std::fmax(mx, h[j]);
    }
    for (double& v : h) total += (v = std::exp(v - mx));
    for (int j = 0; j < 10; j++) worst = std::fmax(worst, std::abs(yv[i * 10 + j] - h[j] / total));
  }
  std::printf("link_static: softmax(gelu(x @ w + b)) on %s, max abs error %.2e, CPU target %s\n",
              shape_str(y.shape()).c_str(), worst, cpu_target().c_str());
  return worst < 1e-5 ? 0 : 1;
}
