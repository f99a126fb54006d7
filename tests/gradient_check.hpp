// Gradient references for the backward kernels: central finite differences of an op's float64
// reference function (elementwise_specs.hpp), times the result's gradient, summed back to each
// input's shape where it was broadcast. Independent of opforge's kernels.
#pragma once
#include <cmath>
#include <vector>

#include "elementwise_specs.hpp"

namespace ref {

// Sums `full` (of the broadcast shape) down to `shape`, which broadcasts to it.
inline Expected sum_to(const Expected& full, const Shape& shape) {
  size_t rank = full.shape.size(), lead = rank - shape.size();
  Shape st = dense_strides(shape), bst(rank, 0);
  for (size_t i = 0; i < shape.size(); i++) bst[lead + i] = shape[i] == 1 ? 0 : st[i];
  Expected e{std::vector<double>(size_t(numel(shape)), 0.0), shape};
  std::vector<int64_t> idx(rank, 0);
  for (size_t j = 0; j < full.values.size(); j++) {
    int64_t off = 0;
    for (size_t d = 0; d < rank; d++) off += idx[d] * bst[d];
    e.values[size_t(off)] += full.values[j];
    for (int d = int(rank) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < full.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return e;
}

// d f / d x_i * g by central differences, for every non-bool input i of spec `s` (in order).
inline std::vector<Expected> fd_gradients(const EwSpec& s, const std::vector<Tensor>& in,
                                          const Tensor& grad) {
  std::vector<Tensor> args = in;
  args.push_back(grad);
  std::vector<Expected> out;
  for (int i = 0; i < s.arity; i++) {
    if ((s.bool_mask >> i) & 1) continue;
    Expected full = broadcast_eval(args, [&](const std::vector<double>& a) {
      std::vector<double> x(a.begin(), a.end() - 1);
      const double at = x[size_t(i)], y = s.fn(x, DType::Float64);
      auto f = [&](double v) {
        x[size_t(i)] = v;
        return s.fn(x, DType::Float64);
      };
      // A step that crosses a jump (mod where a / b nears an integer) makes the one-sided
      // differences disagree: halve it until they agree, as they do wherever f is smooth.
      double h = 1e-6 * std::max(1.0, std::fabs(at)), up = f(at + h), down = f(at - h);
      for (int k = 0; k < 30 && std::fabs((up - y) - (y - down)) >
                                    1e-3 * (std::fabs(up - y) + std::fabs(y - down)) + 1e-12;
           k++) {
        h /= 2;
        up = f(at + h);
        down = f(at - h);
      }
      return (up - down) / (2 * h) * a.back();
    });
    out.push_back(sum_to(full, in[size_t(i)].shape()));
  }
  return out;
}

// Finite differences in float64 are good to about 1e-9 here; a float32 kernel to its own rounding.
inline Tol gradient_tol(const EwSpec& s, DType dt) {
  return dt == DType::Float64 ? Tol{1e-6, 1e-7} : loosest(s.tol(dt), {1e-4, 1e-5});
}

}  // namespace ref
