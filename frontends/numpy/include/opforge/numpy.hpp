// NumPy-style API over the opforge runtime: NumPy's names, defaults (float64 creation, axis=None
// reductions) and semantics (true division of integers gives float64, `std`, `dot`, `stack`).
#pragma once
#include <cmath>
#include <optional>
#include <vector>

#include "opforge/ops.hpp"
#include "opforge/tensor.hpp"

namespace opforge::numpy {

using ndarray = Tensor;
using Axes = std::optional<std::vector<int>>;  // nullopt: NumPy's axis=None

inline ndarray zeros(const Shape& s, DType d = DType::Float64) { return Tensor::zeros(s, d); }
inline ndarray ones(const Shape& s, DType d = DType::Float64) { return Tensor::ones(s, d); }
inline ndarray full(const Shape& s, double v, DType d = DType::Float64) {
  return Tensor::full(s, v, d);
}
inline ndarray empty(const Shape& s, DType d = DType::Float64) { return Tensor::empty(s, d); }
inline ndarray arange(double start, double stop, double step = 1, DType d = DType::Float64) {
  return Tensor::arange(start, stop, step, d);
}
template <class T>
ndarray array(const std::vector<T>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

inline ndarray add(const ndarray& a, const ndarray& b) { return opforge::add(a, b); }
inline ndarray subtract(const ndarray& a, const ndarray& b) { return sub(a, b); }
inline ndarray multiply(const ndarray& a, const ndarray& b) { return mul(a, b); }
// True division: integer operands give float64, as in NumPy.
inline ndarray divide(const ndarray& a, const ndarray& b) {
  auto f = [](const ndarray& t) { return is_floating(t.dtype()) ? t : t.to(DType::Float64); };
  return div(f(a), f(b));
}
inline ndarray true_divide(const ndarray& a, const ndarray& b) { return divide(a, b); }
inline ndarray floor_divide(const ndarray& a, const ndarray& b) {
  ndarray q = div(a, b);
  return is_floating(q.dtype()) ? opforge::floor(q) : q;
}
inline ndarray power(const ndarray& a, const ndarray& b) { return opforge::pow(a, b); }
inline ndarray remainder(const ndarray& a, const ndarray& b) { return opforge::mod(a, b); }
inline ndarray mod(const ndarray& a, const ndarray& b) { return opforge::mod(a, b); }
inline ndarray maximum(const ndarray& a, const ndarray& b) { return opforge::maximum(a, b); }
inline ndarray minimum(const ndarray& a, const ndarray& b) { return opforge::minimum(a, b); }
inline ndarray negative(const ndarray& a) { return neg(a); }
inline ndarray absolute(const ndarray& a) { return opforge::abs(a); }
inline ndarray rint(const ndarray& a) { return opforge::round(a); }
inline ndarray equal(const ndarray& a, const ndarray& b) { return eq(a, b); }
inline ndarray not_equal(const ndarray& a, const ndarray& b) { return ne(a, b); }
inline ndarray less(const ndarray& a, const ndarray& b) { return lt(a, b); }
inline ndarray less_equal(const ndarray& a, const ndarray& b) { return le(a, b); }
inline ndarray greater(const ndarray& a, const ndarray& b) { return gt(a, b); }
inline ndarray greater_equal(const ndarray& a, const ndarray& b) { return ge(a, b); }
using opforge::ceil;
using opforge::clip;
using opforge::cos;
using opforge::exp;
using opforge::expm1;
using opforge::floor;
using opforge::log;
using opforge::log1p;
using opforge::logical_and;
using opforge::logical_not;
using opforge::logical_or;
using opforge::logical_xor;
using opforge::sign;
using opforge::sin;
using opforge::sqrt;
using opforge::tanh;
using opforge::where;

namespace detail {
inline std::vector<int> axes_or_all(const Axes& a) { return a ? *a : std::vector<int>{}; }
}  // namespace detail

inline ndarray sum(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false) {
  return opforge::sum(a, detail::axes_or_all(axis), keepdims);
}
inline ndarray mean(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false) {
  return opforge::mean(a, detail::axes_or_all(axis), keepdims);
}
inline ndarray prod(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false) {
  return opforge::prod(a, detail::axes_or_all(axis), keepdims);
}
inline ndarray amax(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false) {
  return opforge::max(a, detail::axes_or_all(axis), keepdims);
}
inline ndarray amin(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false) {
  return opforge::min(a, detail::axes_or_all(axis), keepdims);
}
inline ndarray var(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false,
                   double ddof = 0) {
  return opforge::var(a, detail::axes_or_all(axis), keepdims, ddof);
}
inline ndarray std(const ndarray& a, const Axes& axis = std::nullopt, bool keepdims = false,
                   double ddof = 0) {
  return opforge::sqrt(var(a, axis, keepdims, ddof));
}
inline ndarray argmax(const ndarray& a, std::optional<int> axis = std::nullopt) {
  return opforge::argmax(a, axis);
}
inline ndarray argmin(const ndarray& a, std::optional<int> axis = std::nullopt) {
  return opforge::argmin(a, axis);
}

inline ndarray matmul(const ndarray& a, const ndarray& b) { return opforge::matmul(a, b); }
// dot: matmul for 1-D and 2-D operands, with a scalar for two vectors.
inline ndarray dot(const ndarray& a, const ndarray& b) {
  OPFORGE_CHECK(a.dim() <= 2 && b.dim() <= 2)
      << "numpy.dot: only 1-D and 2-D operands are supported, got ranks " << a.dim() << " and "
      << b.dim();
  return opforge::matmul(a, b);
}
inline ndarray transpose(const ndarray& a, std::optional<std::vector<int>> axes = std::nullopt) {
  if (axes) return a.permute(*axes);
  std::vector<int> rev(size_t(a.dim()));
  for (int i = 0; i < a.dim(); i++) rev[size_t(i)] = a.dim() - 1 - i;
  return a.permute(rev);
}
inline ndarray reshape(const ndarray& a, const Shape& s) { return a.reshape(s); }
inline ndarray concatenate(const std::vector<ndarray>& xs, int axis = 0) {
  return concat(xs, axis);
}
inline ndarray stack(const std::vector<ndarray>& xs, int axis = 0) {
  OPFORGE_CHECK(!xs.empty()) << "numpy.stack: needs at least one array";
  std::vector<ndarray> u;
  for (const auto& x : xs) u.push_back(x.unsqueeze(axis));
  return concat(u, axis);
}
inline ndarray take(const ndarray& a, const ndarray& indices,
                    std::optional<int> axis = std::nullopt) {
  return axis ? gather(a, *axis, indices) : gather(a.reshape({-1}), 0, indices);
}
inline ndarray pad(const ndarray& a, const std::vector<std::pair<int64_t, int64_t>>& width,
                   double constant = 0) {
  return opforge::pad(a, width, constant);
}

}  // namespace opforge::numpy
