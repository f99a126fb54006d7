// Float64 reference implementations and comparison helpers for the op tests. Everything here is
// plain C++ on std::vector<double>: inputs are read with Tensor::to_double_vector() (row-major,
// any dtype, views respected) and results are compared with expect_close().
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"

namespace ref {

using opforge::DType;
using opforge::Shape;
using opforge::Tensor;

inline constexpr DType kFloats[] = {DType::Float32, DType::Float64};
inline const std::vector<DType> kFloatTypes = {DType::Float32, DType::Float64};
inline const std::vector<DType> kIntTypes = {DType::Int32, DType::Int64};
inline const std::vector<DType> kNumericTypes = {DType::Int32, DType::Int64, DType::Float32,
                                                 DType::Float64};
inline const std::vector<DType> kAllTypes = {DType::Bool, DType::Int32, DType::Int64,
                                             DType::Float32, DType::Float64};
inline const std::vector<DType> kBoolTypes = {DType::Bool};

inline std::string sstr(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); i++) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}
inline std::string dname(DType t) { return std::string(opforge::dtype_name(t)); }

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Row-major strides (in elements) of a dense array of this shape.
inline Shape dense_strides(const Shape& s) {
  Shape st(s.size(), 1);
  int64_t acc = 1;
  for (int i = int(s.size()) - 1; i >= 0; i--) {
    st[size_t(i)] = acc;
    acc *= std::max<int64_t>(s[size_t(i)], 1);
  }
  return st;
}

// A dense row-major array of doubles: the reference's view of a tensor.
struct Dense {
  std::vector<double> v;
  Shape shape;
};
inline Dense dense(const Tensor& t) { return {t.to_double_vector(), t.shape()}; }

// The expected output of an op: values in row-major order and the shape.
struct Expected {
  std::vector<double> values;
  Shape shape;
};

// A deterministic seed from a label (FNV-1a), so every test case has its own fixed data.
inline uint64_t seed_of(const std::string& label) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : label) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Tolerances
// ---------------------------------------------------------------------------------------------

// |got - want| <= atol + rtol * |want|
struct Tol {
  double rtol = 0, atol = 0;
};
inline Tol exact() { return {0, 0}; }
// Plain arithmetic (one or two roundings in the result type).
inline Tol tol_for(DType t) {
  switch (t) {
    case DType::Float32:
      return {1e-5, 1e-5};
    case DType::Float64:
      return {1e-10, 1e-10};
    default:
      return exact();
  }
}
// Transcendental functions (exp, log, erf, pow, ...): float32 kernels may use polynomial
// approximations a few ulp off.
inline Tol transcendental_tol(DType t) {
  switch (t) {
    case DType::Float32:
      return {1e-4, 1e-4};
    case DType::Float64:
      return {1e-10, 1e-10};
    default:
      return exact();
  }
}
// Accumulations over k terms (reductions, matmul, conv): rounding error grows like sqrt(k).
inline Tol accum_tol(DType t, int64_t k) {
  double s = std::sqrt(double(std::max<int64_t>(k, 1)));
  switch (t) {
    case DType::Float32:
      return {std::max(2e-5 * s, 1e-5), std::max(2e-5 * s, 1e-5)};
    case DType::Float64:
      return {1e-10 * s, 1e-10 * s};
    default:
      return exact();
  }
}
inline Tol loosest(Tol a, Tol b) { return {std::max(a.rtol, b.rtol), std::max(a.atol, b.atol)}; }

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

inline bool value_close(double got, double want, Tol tol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& want,
                                            const Shape& want_shape, DType want_dtype, Tol tol) {
  if (!got.defined()) return ::testing::AssertionFailure() << "the result tensor is undefined";
  if (got.dtype() != want_dtype)
    return ::testing::AssertionFailure()
           << "dtype is " << dname(got.dtype()) << ", expected " << dname(want_dtype);
  if (got.shape() != want_shape)
    return ::testing::AssertionFailure()
           << "shape is " << sstr(got.shape()) << ", expected " << sstr(want_shape);
  if (int64_t(want.size()) != numel(want_shape))
    return ::testing::AssertionFailure()
           << "reference bug: " << want.size() << " expected values for shape " << sstr(want_shape);
  std::vector<double> g = got.to_double_vector();
  if (g.size() != want.size())
    return ::testing::AssertionFailure() << "to_double_vector() returned " << g.size()
                                         << " values for shape " << sstr(got.shape());
  size_t bad = 0;
  double worst = 0;
  std::ostringstream os;
  Shape st = dense_strides(want_shape);
  for (size_t i = 0; i < g.size(); i++) {
    if (value_close(g[i], want[i], tol)) continue;
    if (bad < 8) {
      os << "\n  at [";
      int64_t rem = int64_t(i);
      for (size_t d = 0; d < want_shape.size(); d++) {
        os << (d ? ", " : "") << rem / st[d];
        rem %= st[d];
      }
      os.precision(17);
      os << "]: got " << g[i] << ", expected " << want[i];
    }
    if (!std::isnan(g[i]) && !std::isnan(want[i]))
      worst = std::max(worst, std::fabs(g[i] - want[i]));
    bad++;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << g.size() << " values differ (dtype " << dname(want_dtype) << ", shape "
         << sstr(want_shape) << ", rtol " << tol.rtol << ", atol " << tol.atol
         << ", largest difference " << worst << "):" << os.str();
}

inline void expect_close(const Tensor& got, const std::vector<double>& want,
                         const Shape& want_shape, DType dtype, Tol tol) {
  EXPECT_TRUE(all_close(got, want, want_shape, dtype, tol));
}
inline void expect_close(const Tensor& got, const std::vector<double>& want,
                         const Shape& want_shape, DType dtype) {
  expect_close(got, want, want_shape, dtype, tol_for(dtype));
}
inline void expect_close(const Tensor& got, const Expected& want, DType dtype, Tol tol) {
  expect_close(got, want.values, want.shape, dtype, tol);
}
inline void expect_close(const Tensor& got, const Expected& want, DType dtype) {
  expect_close(got, want.values, want.shape, dtype, tol_for(dtype));
}

// ---------------------------------------------------------------------------------------------
// Test data
// ---------------------------------------------------------------------------------------------

// Builds a contiguous tensor of any dtype from doubles (bool: nonzero is true; ints: truncated).
inline Tensor make(const std::vector<double>& v, const Shape& shape, DType t) {
  if (int64_t(v.size()) != numel(shape))
    throw std::invalid_argument("ref::make: " + std::to_string(v.size()) + " values for shape " +
                                sstr(shape));
  Tensor out = Tensor::empty(shape, t);
  size_t n = v.size();
  switch (t) {
    case DType::Bool: {
      std::vector<uint8_t> b(n);
      for (size_t i = 0; i < n; i++) b[i] = v[i] != 0;
      out.copy_from_host(b.data(), n);
      break;
    }
    case DType::Int32: {
      std::vector<int32_t> b(n);
      for (size_t i = 0; i < n; i++) b[i] = int32_t(v[i]);
      out.copy_from_host(b.data(), n * 4);
      break;
    }
    case DType::Int64: {
      std::vector<int64_t> b(n);
      for (size_t i = 0; i < n; i++) b[i] = int64_t(v[i]);
      out.copy_from_host(b.data(), n * 8);
      break;
    }
    case DType::Float32: {
      std::vector<float> b(n);
      for (size_t i = 0; i < n; i++) b[i] = float(v[i]);
      out.copy_from_host(b.data(), n * 4);
      break;
    }
    case DType::Float64:
      out.copy_from_host(v.data(), n * 8);
      break;
  }
  return out;
}

// Kinds of random data. Floating data come from Tensor::rand / Tensor::randn with a fixed
// Generator; integer and bool data are derived from the same draws. None is all zeros.
enum class Data {
  Normal,         // floats: 2 * N(0,1); ints: uniform in [-50, 50]
  Positive,       // floats: U(0,1) + 0.1; ints: [1, 50]   (log, sqrt, pow bases)
  AboveMinusOne,  // floats: 3 * U(0,1) - 0.9              (log1p)
  NonZero,        // floats: +-(U(0,1) + 0.5); ints: +-[1, 9]  (divisors)
  Quantized,  // floats: multiples of 0.25 incl. 0 and halves (floor/ceil/round/sign); ints: round(3
              // N)
  SmallInt,   // integer values in [-3, 3] in every dtype (comparisons hit equality)
  Unit,       // floats: U(0,1); ints: [0, 9]
  NearOne,    // floats: 0.9 + 0.2 U(0,1); ints: +-1      (products over long axes)
  Distinct,   // all values different (argmax/argmin without ties)
  Bool,       // random true/false
};

inline std::vector<double> random_values(int64_t n, DType t, Data d, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n <= 0) return out;
  opforge::Generator g(seed);
  std::vector<double> u = Tensor::rand({n}, DType::Float64, g).to_double_vector();
  std::vector<double> z = Tensor::randn({n}, DType::Float64, g).to_double_vector();
  bool fl = opforge::is_floating(t);
  if (t == DType::Bool) d = Data::Bool;
  if (d == Data::Distinct) {
    std::vector<size_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return u[a] < u[b]; });
    for (size_t i = 0; i < size_t(n); i++)
      out[order[i]] = double(int64_t(i) - n / 2) * (fl ? 0.5 : 1.0);
    return out;
  }
  for (size_t i = 0; i < size_t(n); i++) {
    double x = 0;
    switch (d) {
      case Data::Normal:
        x = fl ? 2 * z[i] : std::floor(u[i] * 101) - 50;
        break;
      case Data::Positive:
        x = fl ? u[i] + 0.1 : std::floor(u[i] * 50) + 1;
        break;
      case Data::AboveMinusOne:
        x = fl ? 3 * u[i] - 0.9 : std::floor(u[i] * 10);
        break;
      case Data::NonZero:
        x = (z[i] < 0 ? -1 : 1) * (fl ? u[i] + 0.5 : std::floor(u[i] * 9) + 1);
        break;
      case Data::Quantized:
        x = fl ? std::round(z[i] * 8) / 4 : std::round(z[i] * 3);
        break;
      case Data::SmallInt:
        x = std::clamp(std::round(z[i] * 1.5), -3.0, 3.0);
        break;
      case Data::Unit:
        x = fl ? u[i] : std::floor(u[i] * 10);
        break;
      case Data::NearOne:
        x = fl ? 0.9 + 0.2 * u[i] : (z[i] < 0 ? -1 : 1);
        break;
      case Data::Bool:
        x = u[i] < 0.5 ? 1 : 0;
        break;
      case Data::Distinct:
        break;
    }
    out[i] = x;
  }
  // "never zeros": a tensor of more than one element is never constant (changed within its domain).
  if (n > 1 && std::all_of(out.begin(), out.end(), [&](double v) { return v == out[0]; }))
    out[0] = d == Data::Bool ? 1 - out[0] : d == Data::NonZero ? -out[0] : out[0] + 1;
  return out;
}

inline Tensor random(const Shape& shape, DType t, Data d, uint64_t seed) {
  return make(random_values(numel(shape), t, d, seed), shape, t);
}
inline Tensor random(const Shape& shape, DType t, Data d, const std::string& label) {
  return random(shape, t, d, seed_of(label));
}

// ---------------------------------------------------------------------------------------------
// Broadcasting elementwise reference
// ---------------------------------------------------------------------------------------------

inline Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const auto& s : shapes) {
    size_t lead = rank - s.size();
    for (size_t i = 0; i < s.size(); i++) {
      int64_t& o = out[lead + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o == 1) {
        o = s[i];
        continue;
      }
      throw std::invalid_argument("ref::broadcast_shapes: incompatible shapes");
    }
  }
  // a dim of size 0 in any input wins over 1s
  for (const auto& s : shapes) {
    size_t lead = rank - s.size();
    for (size_t i = 0; i < s.size(); i++)
      if (s[i] == 0) out[lead + i] = 0;
  }
  return out;
}

using ScalarFn = std::function<double(const std::vector<double>&)>;

inline Expected broadcast_eval(const std::vector<Dense>& in, const ScalarFn& fn) {
  std::vector<Shape> shapes;
  for (const auto& d : in) shapes.push_back(d.shape);
  Shape out_shape = broadcast_shapes(shapes);
  size_t rank = out_shape.size();
  int64_t n = numel(out_shape);
  // broadcast strides of each input over the output's dims (0 where broadcast)
  std::vector<Shape> bst(in.size(), Shape(rank, 0));
  for (size_t k = 0; k < in.size(); k++) {
    Shape st = dense_strides(in[k].shape);
    size_t lead = rank - in[k].shape.size();
    for (size_t i = 0; i < in[k].shape.size(); i++)
      bst[k][lead + i] = in[k].shape[i] == 1 ? 0 : st[i];
  }
  Expected e;
  e.shape = out_shape;
  e.values.resize(size_t(n));
  std::vector<int64_t> idx(rank, 0);
  std::vector<double> args(in.size());
  for (int64_t j = 0; j < n; j++) {
    for (size_t k = 0; k < in.size(); k++) {
      int64_t off = 0;
      for (size_t d = 0; d < rank; d++) off += idx[d] * bst[k][d];
      args[k] = in[k].v[size_t(off)];
    }
    e.values[size_t(j)] = fn(args);
    for (int d = int(rank) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < out_shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return e;
}

inline Expected broadcast_eval(const std::vector<Tensor>& inputs, const ScalarFn& fn) {
  std::vector<Dense> in;
  for (const auto& t : inputs) in.push_back(dense(t));
  return broadcast_eval(in, fn);
}

// Python semantics for integer // and %, and float %: the remainder takes the divisor's sign.
inline double floor_div(double a, double b) { return std::floor(a / b); }
inline double py_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// NaN-propagating maximum/minimum.
inline double nan_max(double a, double b) {
  return std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b);
}
inline double nan_min(double a, double b) {
  return std::isnan(a) ? a : std::isnan(b) ? b : std::min(a, b);
}

// Value of a cast of v to t, as C would do it for in-range values (bool: nonzero is true).
inline double cast_value(double v, DType t) {
  switch (t) {
    case DType::Bool:
      return v != 0 ? 1 : 0;
    case DType::Int32:
    case DType::Int64:
      return std::trunc(v);
    case DType::Float32:
      return double(float(v));
    case DType::Float64:
      return v;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

// Axes normalised to [0, rank), sorted; an empty list means all axes.
inline std::vector<int> norm_axes(const std::vector<int>& axes, int rank) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; i++) out.push_back(i);
    return out;
  }
  for (int a : axes) out.push_back(a < 0 ? a + rank : a);
  std::sort(out.begin(), out.end());
  return out;
}

using ReduceFn = std::function<double(const std::vector<double>&)>;

// Reduces x over `axes` (empty: all). fn receives the reduced elements in row-major order of the
// reduced axes, so an index into its argument is the flat index into the reduced block.
inline Expected reduce(const Dense& x, const std::vector<int>& axes_in, bool keepdims,
                       const ReduceFn& fn) {
  int rank = int(x.shape.size());
  std::vector<int> axes = norm_axes(axes_in, rank);
  std::vector<bool> red(size_t(rank), false);
  for (int a : axes) red[size_t(a)] = true;
  Shape kept;  // output shape without keepdims
  Shape out_shape;
  for (int d = 0; d < rank; d++) {
    if (red[size_t(d)]) {
      if (keepdims) out_shape.push_back(1);
    } else {
      kept.push_back(x.shape[size_t(d)]);
      out_shape.push_back(x.shape[size_t(d)]);
    }
  }
  Shape kst = dense_strides(kept);
  int64_t nout = numel(kept);
  std::vector<std::vector<double>> buckets(static_cast<size_t>(nout));
  int64_t n = numel(x.shape);
  std::vector<int64_t> idx(size_t(rank), 0);
  for (int64_t j = 0; j < n; j++) {
    int64_t o = 0;
    size_t kd = 0;
    for (int d = 0; d < rank; d++)
      if (!red[size_t(d)]) o += idx[size_t(d)] * kst[kd++];
    buckets[size_t(o)].push_back(x.v[size_t(j)]);
    for (int d = rank - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < x.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  Expected e;
  e.shape = out_shape;
  for (auto& b : buckets) e.values.push_back(fn(b));
  return e;
}

// Number of elements each output of a reduction over `axes` combines.
inline int64_t reduced_count(const Shape& s, const std::vector<int>& axes) {
  int64_t k = 1;
  for (int a : norm_axes(axes, int(s.size()))) k *= s[size_t(a)];
  return k;
}

namespace fn {
inline double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
inline double prod(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}
inline double mean(const std::vector<double>& v) { return sum(v) / double(v.size()); }
inline double max(const std::vector<double>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  return m;
}
inline double min(const std::vector<double>& v) {
  double m = std::numeric_limits<double>::infinity();
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::min(m, x);
  }
  return m;
}
inline double logsumexp(const std::vector<double>& v) {
  double m = max(v);
  if (!std::isfinite(m)) m = 0;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}
inline double var(const std::vector<double>& v, double ddof) {
  double mu = mean(v), s = 0;
  for (double x : v) s += (x - mu) * (x - mu);
  return s / (double(v.size()) - ddof);
}
// First index of the maximum / minimum.
inline double argmax(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); i++)
    if (v[i] > v[best]) best = i;
  return double(best);
}
inline double argmin(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); i++)
    if (v[i] < v[best]) best = i;
  return double(best);
}
}  // namespace fn

// softmax / log_softmax along one axis.
inline Expected softmax(const Dense& x, int axis, bool log) {
  int rank = int(x.shape.size());
  if (axis < 0) axis += rank;
  int64_t outer = 1, n = x.shape[size_t(axis)], inner = 1;
  for (int d = 0; d < axis; d++) outer *= x.shape[size_t(d)];
  for (int d = axis + 1; d < rank; d++) inner *= x.shape[size_t(d)];
  Expected e{std::vector<double>(x.v.size()), x.shape};
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      auto at = [&](int64_t k) { return size_t((o * n + k) * inner + i); };
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < n; k++) m = std::max(m, x.v[at(k)]);
      if (!std::isfinite(m)) m = 0;
      double s = 0;
      for (int64_t k = 0; k < n; k++) s += std::exp(x.v[at(k)] - m);
      for (int64_t k = 0; k < n; k++)
        e.values[at(k)] = log ? x.v[at(k)] - m - std::log(s) : std::exp(x.v[at(k)] - m) / s;
    }
  return e;
}

// The gradient of softmax (log: log_softmax) along `axis` at x, given g, the result's gradient.
inline Expected softmax_grad(const Dense& x, const Dense& g, int axis, bool log) {
  Expected y = softmax(x, axis, log), e = y;
  int rank = int(x.shape.size());
  if (axis < 0) axis += rank;
  int64_t outer = 1, n = x.shape[size_t(axis)], inner = 1;
  for (int d = 0; d < axis; d++) outer *= x.shape[size_t(d)];
  for (int d = axis + 1; d < rank; d++) inner *= x.shape[size_t(d)];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      auto at = [&](int64_t k) { return size_t((o * n + k) * inner + i); };
      double s = 0;
      for (int64_t k = 0; k < n; k++) s += log ? g.v[at(k)] : g.v[at(k)] * y.values[at(k)];
      for (int64_t k = 0; k < n; k++)
        e.values[at(k)] =
            log ? g.v[at(k)] - std::exp(y.values[at(k)]) * s : y.values[at(k)] * (g.v[at(k)] - s);
    }
  return e;
}

// Each row's -sum p log_softmax(x) over (N, C) scores x and target distributions p; with `g`
// (one value per row), the scores' gradient (softmax(x) sum(p) - p) g instead.
inline Expected cross_entropy(const Dense& x, const Dense& p,
                              const std::vector<double>* g = nullptr) {
  int64_t N = x.shape[0], C = x.shape[1];
  Expected lsm = softmax(x, 1, true);
  Expected e{std::vector<double>(size_t(g ? N * C : N), 0.0), g ? x.shape : Shape{N}};
  for (int64_t n = 0; n < N; n++) {
    double mass = 0, loss = 0;
    for (int64_t c = 0; c < C; c++) {
      size_t i = size_t(n * C + c);
      mass += p.v[i];
      if (p.v[i] != 0) loss -= p.v[i] * lsm.values[i];
    }
    if (!g) {
      e.values[size_t(n)] = loss;
      continue;
    }
    for (int64_t c = 0; c < C; c++) {
      size_t i = size_t(n * C + c);
      e.values[i] = (std::exp(lsm.values[i]) * mass - p.v[i]) * (*g)[size_t(n)];
    }
  }
  return e;
}

// layer_norm over the trailing `ndims` dims; weight/bias empty means 1 and 0.
inline Expected layer_norm(const Dense& x, int ndims, const std::vector<double>& weight,
                           const std::vector<double>& bias, double eps) {
  int rank = int(x.shape.size());
  int64_t n = 1;
  for (int d = rank - ndims; d < rank; d++) n *= x.shape[size_t(d)];
  int64_t rows = n == 0 ? 0 : numel(x.shape) / n;
  Expected e{std::vector<double>(x.v.size()), x.shape};
  for (int64_t r = 0; r < rows; r++) {
    const double* p = x.v.data() + r * n;
    double mu = 0;
    for (int64_t k = 0; k < n; k++) mu += p[k];
    mu /= double(n);
    double var = 0;
    for (int64_t k = 0; k < n; k++) var += (p[k] - mu) * (p[k] - mu);
    var /= double(n);
    double inv = 1 / std::sqrt(var + eps);
    for (int64_t k = 0; k < n; k++) {
      double w = weight.empty() ? 1 : weight[size_t(k)], b = bias.empty() ? 0 : bias[size_t(k)];
      e.values[size_t(r * n + k)] = (p[k] - mu) * inv * w + b;
    }
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Contraction
// ---------------------------------------------------------------------------------------------

// NumPy matmul: 1-D operands are promoted (and the added dim removed), batch dims broadcast.
inline Expected matmul(const Dense& a_in, const Dense& b_in) {
  Dense a = a_in, b = b_in;
  bool a1 = a.shape.size() == 1, b1 = b.shape.size() == 1;
  if (a1) a.shape = {1, a.shape[0]};
  if (b1) b.shape = {b.shape[0], 1};
  int64_t M = a.shape[a.shape.size() - 2], K = a.shape.back(), N = b.shape.back();
  if (b.shape[b.shape.size() - 2] != K)
    throw std::invalid_argument("ref::matmul: inner dims differ");
  Shape ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes({ab, bb});
  int64_t nb = numel(batch);
  // batch offsets of a and b for each output batch index
  auto batch_offsets = [&](const Shape& s, int64_t mat) {
    std::vector<int64_t> offs(static_cast<size_t>(nb));
    Shape st = dense_strides(s);
    size_t lead = batch.size() - s.size();
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t j = 0; j < nb; j++) {
      int64_t o = 0;
      for (size_t i = 0; i < s.size(); i++) o += (s[i] == 1 ? 0 : idx[lead + i]) * st[i];
      offs[size_t(j)] = o * mat;
      for (int d = int(batch.size()) - 1; d >= 0; d--) {
        if (++idx[size_t(d)] < batch[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
    return offs;
  };
  auto ao = batch_offsets(ab, M * K), bo = batch_offsets(bb, K * N);
  Expected e;
  e.values.assign(size_t(nb * M * N), 0.0);
  for (int64_t j = 0; j < nb; j++) {
    const double* A = a.v.data() + ao[size_t(j)];
    const double* B = b.v.data() + bo[size_t(j)];
    double* C = e.values.data() + j * M * N;
    for (int64_t m = 0; m < M; m++)
      for (int64_t k = 0; k < K; k++) {
        double av = A[m * K + k];
        for (int64_t n = 0; n < N; n++) C[m * N + n] += av * B[k * N + n];
      }
  }
  e.shape = batch;
  if (!a1) e.shape.push_back(M);
  if (!b1) e.shape.push_back(N);
  return e;
}

// 2-D transpose of a dense matrix.
inline Dense transpose2d(const Dense& a) {
  int64_t R = a.shape[0], C = a.shape[1];
  Dense t{std::vector<double>(a.v.size()), {C, R}};
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++) t.v[size_t(c * R + r)] = a.v[size_t(r * C + c)];
  return t;
}

// alpha * op(A) op(B) + beta * C, C (optional) broadcast to (M, N).
inline Expected gemm(const Dense& a, const Dense& b, const std::optional<Dense>& c, double alpha,
                     double beta, bool trans_a, bool trans_b) {
  Expected p = matmul(trans_a ? transpose2d(a) : a, trans_b ? transpose2d(b) : b);
  if (c) {
    Expected cb = broadcast_eval({Dense{std::vector<double>(p.values.size(), 0.0), p.shape}, *c},
                                 [](const std::vector<double>& v) { return v[1]; });
    for (size_t i = 0; i < p.values.size(); i++)
      p.values[i] = alpha * p.values[i] + beta * cb.values[i];
  } else {
    for (auto& v : p.values) v *= alpha;
  }
  return p;
}

// PyTorch's linear: x (..., K) W^T (W: (N, K)) + bias (N values or none), then ReLU if asked.
inline Expected linear(const Dense& x, const Dense& w, const std::optional<Dense>& bias,
                       bool relu) {
  int64_t K = x.shape.back(), M = 1;
  for (size_t d = 0; d + 1 < x.shape.size(); d++) M *= x.shape[d];
  Dense x2{x.v, {M, K}};
  Expected y = gemm(x2, w, bias, 1, 1, false, true);
  if (relu)
    for (auto& v : y.values) v = v < 0 ? 0 : v;
  y.shape = x.shape;
  y.shape.back() = w.shape[0];
  return y;
}

// ---------------------------------------------------------------------------------------------
// Window ops (NCHW)
// ---------------------------------------------------------------------------------------------

struct ConvParams {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};

// x: (N, C, H, W); w: (Cout, C / groups, KH, KW); bias: Cout values or empty.
inline Expected conv2d(const Dense& x, const Dense& w, const std::vector<double>& bias,
                       const ConvParams& p) {
  int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t CO = w.shape[0], CG = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  int64_t OH = (H + 2 * p.pad_h - p.dil_h * (KH - 1) - 1) / p.stride_h + 1;
  int64_t OW = (W + 2 * p.pad_w - p.dil_w * (KW - 1) - 1) / p.stride_w + 1;
  int64_t cout_g = CO / p.groups;
  (void)C;
  Expected e{std::vector<double>(size_t(N * CO * OH * OW), 0.0), {N, CO, OH, OW}};
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < CO; co++) {
      int64_t g = co / cout_g;
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double acc = bias.empty() ? 0 : bias[size_t(co)];
          for (int64_t ci = 0; ci < CG; ci++)
            for (int64_t kh = 0; kh < KH; kh++) {
              int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dil_h;
              if (ih < 0 || ih >= H) continue;
              for (int64_t kw = 0; kw < KW; kw++) {
                int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dil_w;
                if (iw < 0 || iw >= W) continue;
                int64_t c = g * CG + ci;
                acc += x.v[size_t(((n * x.shape[1] + c) * H + ih) * W + iw)] *
                       w.v[size_t(((co * CG + ci) * KH + kh) * KW + kw)];
              }
            }
          e.values[size_t(((n * CO + co) * OH + oh) * OW + ow)] = acc;
        }
    }
  return e;
}

struct PoolParams {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 0, stride_w = 0, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;
};

// The same geometries as opforge's options.
inline opforge::Conv2dOptions options_of(const ConvParams& p) {
  opforge::Conv2dOptions o;
  o.stride = {p.stride_h, p.stride_w};
  o.padding = {p.pad_h, p.pad_w};
  o.dilation = {p.dil_h, p.dil_w};
  o.groups = p.groups;
  return o;
}
inline opforge::Pool2dOptions options_of(const PoolParams& p) {
  opforge::Pool2dOptions o;
  o.kernel = {p.kernel_h, p.kernel_w};
  o.stride = {p.stride_h, p.stride_w};
  o.padding = {p.pad_h, p.pad_w};
  o.count_include_pad = p.count_include_pad;
  return o;
}
// A k x k pool of one stride and padding both ways.
inline PoolParams square_pool(int64_t k, int64_t stride, int64_t pad, bool count_include_pad) {
  PoolParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.count_include_pad = count_include_pad;
  return p;
}

// max_pool2d (is_max) or avg_pool2d on (N, C, H, W); stride 0 means the kernel size.
inline Expected pool2d(const Dense& x, PoolParams p, bool is_max) {
  if (p.stride_h == 0) p.stride_h = p.kernel_h;
  if (p.stride_w == 0) p.stride_w = p.kernel_w;
  int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OH = (H + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  int64_t OW = (W + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  Expected e{std::vector<double>(size_t(N * C * OH * OW), 0.0), {N, C, OH, OW}};
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double acc = is_max ? -std::numeric_limits<double>::infinity() : 0;
          int64_t valid = 0;
          for (int64_t kh = 0; kh < p.kernel_h; kh++)
            for (int64_t kw = 0; kw < p.kernel_w; kw++) {
              int64_t ih = oh * p.stride_h - p.pad_h + kh, iw = ow * p.stride_w - p.pad_w + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              double v = x.v[size_t(((n * C + c) * H + ih) * W + iw)];
              valid++;
              acc = is_max ? nan_max(acc, v) : acc + v;
            }
          if (!is_max) acc /= double(p.count_include_pad ? p.kernel_h * p.kernel_w : valid);
          e.values[size_t(((n * C + c) * OH + oh) * OW + ow)] = acc;
        }
  return e;
}

// The gradients of conv2d, written as the scatter its forward loop implies (each output's
// gradient flows back along the taps that made it), so they share nothing with the kernels' gather
// form. grad: (N, CO, OH, OW); x_shape / w_shape: the forward's input and weight shapes.
// Calls f(y, x, w) with the flat indices of every (output, tap) pair of a convolution whose tap
// lies inside the image: output y of shape y_shape reads input x through weight w.
template <class F>
void conv2d_taps(const Shape& x_shape, const Shape& w_shape, const Shape& y_shape,
                 const ConvParams& p, F f) {
  int64_t N = x_shape[0], C = x_shape[1], H = x_shape[2], W = x_shape[3];
  int64_t CO = w_shape[0], CG = w_shape[1], KH = w_shape[2], KW = w_shape[3];
  int64_t OH = y_shape[2], OW = y_shape[3], cout_g = CO / p.groups;
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < CO; co++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++)
          for (int64_t ci = 0; ci < CG; ci++)
            for (int64_t kh = 0; kh < KH; kh++)
              for (int64_t kw = 0; kw < KW; kw++) {
                int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dil_h,
                        iw = ow * p.stride_w - p.pad_w + kw * p.dil_w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t c = co / cout_g * CG + ci;
                f(size_t(((n * CO + co) * OH + oh) * OW + ow),
                  size_t(((n * C + c) * H + ih) * W + iw),
                  size_t(((co * CG + ci) * KH + kh) * KW + kw));
              }
}

inline Expected conv2d_backward_input(const Dense& grad, const Dense& w, const Shape& x_shape,
                                      const ConvParams& p) {
  Expected e{std::vector<double>(size_t(numel(x_shape)), 0.0), x_shape};
  conv2d_taps(x_shape, w.shape, grad.shape, p,
              [&](size_t y, size_t x, size_t k) { e.values[x] += grad.v[y] * w.v[k]; });
  return e;
}

inline Expected conv2d_backward_weight(const Dense& x, const Dense& grad, const Shape& w_shape,
                                       const ConvParams& p) {
  Expected e{std::vector<double>(size_t(numel(w_shape)), 0.0), w_shape};
  conv2d_taps(x.shape, w_shape, grad.shape, p,
              [&](size_t y, size_t xi, size_t k) { e.values[k] += grad.v[y] * x.v[xi]; });
  return e;
}

// Where max_pool2d's window (oh, ow) of plane `plane` (offset into x) has its maximum, as an index
// into the plane: the first maximum in row-major order, or the last NaN (PyTorch's rule).
inline int64_t pool_argmax(const Dense& x, size_t plane, int64_t oh, int64_t ow,
                           const PoolParams& p) {
  int64_t H = x.shape[2], W = x.shape[3];
  int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  int64_t best = std::max<int64_t>(h0, 0) * W + std::max<int64_t>(w0, 0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + p.kernel_h, H); ih++)
    for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + p.kernel_w, W); iw++) {
      double v = x.v[plane + size_t(ih * W + iw)];
      if (v > m || std::isnan(v)) m = v, best = ih * W + iw;
    }
  return best;
}

// max_pool2d_with_indices' indices (stride 0 means the kernel size).
inline Expected max_pool2d_indices(const Dense& x, PoolParams p) {
  Expected e = pool2d(x, p, true);  // the shape
  if (p.stride_h == 0) p.stride_h = p.kernel_h;
  if (p.stride_w == 0) p.stride_w = p.kernel_w;
  int64_t H = x.shape[2], W = x.shape[3], OH = e.shape[2], OW = e.shape[3];
  size_t i = 0;
  for (int64_t nc = 0; nc < e.shape[0] * e.shape[1]; nc++)
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++)
        e.values[i++] = double(pool_argmax(x, size_t(nc * H * W), oh, ow, p));
  return e;
}

// The gradient of max_pool2d (is_max) or avg_pool2d: each window's gradient to its first maximum
// in row-major order (a NaN wins; an all -inf window's to its first tap inside the image), as
// PyTorch's indices say, or spread over the window's divisor.
inline Expected pool2d_backward(const Dense& x, const Dense& grad, PoolParams p, bool is_max) {
  if (p.stride_h == 0) p.stride_h = p.kernel_h;
  if (p.stride_w == 0) p.stride_w = p.kernel_w;
  int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OH = grad.shape[2], OW = grad.shape[3];
  Expected e{std::vector<double>(x.v.size(), 0.0), x.shape};
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double g = grad.v[size_t(((n * C + c) * OH + oh) * OW + ow)];
          int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
          size_t plane = size_t((n * C + c) * H * W);
          if (is_max) {
            e.values[plane + size_t(pool_argmax(x, plane, oh, ow, p))] += g;
            continue;
          }
          int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + p.kernel_h, H),
                  ws = std::max<int64_t>(w0, 0), we = std::min(w0 + p.kernel_w, W);
          double count =
              double(p.count_include_pad ? p.kernel_h * p.kernel_w : (he - hs) * (we - ws));
          for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) e.values[plane + size_t(ih * W + iw)] += g / count;
        }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Movement
// ---------------------------------------------------------------------------------------------

// A shape as (outer, the extent of `axis`, inner); a negative axis counts from the end.
inline std::array<int64_t, 3> split_at(const Shape& s, int& axis) {
  int rank = int(s.size());
  if (axis < 0) axis += rank;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= s[size_t(d)];
  for (int d = axis + 1; d < rank; d++) inner *= s[size_t(d)];
  return {outer, s[size_t(axis)], inner};
}

// PyTorch's index_add: x with alpha * source's slices added at index along `axis` (repeats add,
// negative indices count from the end).
inline Expected index_add(const Dense& x, int axis, const std::vector<int64_t>& index,
                          const Dense& source, double alpha) {
  auto [outer, n, inner] = split_at(x.shape, axis);
  int64_t J = int64_t(index.size());
  Expected e{x.v, x.shape};
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < J; j++) {
      int64_t k = index[size_t(j)] < 0 ? index[size_t(j)] + n : index[size_t(j)];
      for (int64_t i = 0; i < inner; i++)
        e.values[size_t((o * n + k) * inner + i)] +=
            alpha * source.v[size_t((o * J + j) * inner + i)];
    }
  return e;
}

// NumPy take(x, index, axis) with a flat index list; negative indices count from the end.
inline Expected take(const Dense& x, int axis, const std::vector<int64_t>& index) {
  auto [outer, n, inner] = split_at(x.shape, axis);
  int64_t J = int64_t(index.size());
  Expected e;
  e.shape = x.shape;
  e.shape[size_t(axis)] = J;
  e.values.resize(size_t(outer * J * inner));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < J; j++) {
      int64_t k = index[size_t(j)] < 0 ? index[size_t(j)] + n : index[size_t(j)];
      for (int64_t i = 0; i < inner; i++)
        e.values[size_t((o * J + j) * inner + i)] = x.v[size_t((o * n + k) * inner + i)];
    }
  return e;
}

// Concatenation along one axis.
inline Expected concat(const std::vector<Dense>& xs, int axis) {
  int rank = int(xs[0].shape.size());
  if (axis < 0) axis += rank;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= xs[0].shape[size_t(d)];
  for (int d = axis + 1; d < rank; d++) inner *= xs[0].shape[size_t(d)];
  Expected e;
  e.shape = xs[0].shape;
  e.shape[size_t(axis)] = 0;
  for (const auto& x : xs) e.shape[size_t(axis)] += x.shape[size_t(axis)];
  for (int64_t o = 0; o < outer; o++)
    for (const auto& x : xs) {
      int64_t chunk = x.shape[size_t(axis)] * inner;
      for (int64_t i = 0; i < chunk; i++) e.values.push_back(x.v[size_t(o * chunk + i)]);
    }
  return e;
}

// Constant padding; pads[d] = {before, after}.
inline Expected pad(const Dense& x, const std::vector<std::pair<int64_t, int64_t>>& pads,
                    double value) {
  size_t rank = x.shape.size();
  Shape os = x.shape;
  for (size_t d = 0; d < rank && d < pads.size(); d++) os[d] += pads[d].first + pads[d].second;
  Expected e{std::vector<double>(size_t(numel(os)), value), os};
  Shape ost = dense_strides(os);
  std::vector<int64_t> idx(rank, 0);
  int64_t n = numel(x.shape);
  for (int64_t j = 0; j < n; j++) {
    int64_t o = 0;
    for (size_t d = 0; d < rank; d++)
      o += (idx[d] + (d < pads.size() ? pads[d].first : 0)) * ost[d];
    e.values[size_t(o)] = x.v[size_t(j)];
    for (int d = int(rank) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < x.shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return e;
}

// Values of a strided view of a dense array (a reference for slice/transpose/expand...).
inline std::vector<double> strided_values(const std::vector<double>& base, const Shape& shape,
                                          const Shape& strides, int64_t offset) {
  std::vector<double> out;
  int64_t n = numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t j = 0; j < n; j++) {
    int64_t o = offset;
    for (size_t d = 0; d < shape.size(); d++) o += idx[d] * strides[d];
    out.push_back(base[size_t(o)]);
    for (int d = int(shape.size()) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Error messages
// ---------------------------------------------------------------------------------------------

// The message of the opforge::Error f throws, or "(no error)".
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const opforge::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Runs f, which must throw opforge::Error whose message contains every part.
template <class F>
void expect_error_impl(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an opforge::Error, but nothing was thrown";
  } catch (const opforge::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos)
          << "the message \"" << msg << "\" does not mention \"" << p << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an opforge::Error, got another exception: " << e.what();
  }
}

// Forces a variant (by name, on whatever device runs the call) for its lifetime and checks at the
// end that it ran.
struct ForcedVariantRuns {
  explicit ForcedVariantRuns(const std::string& n) : name(n), before(calls()) {
    opforge::force_variant(n);
  }
  ~ForcedVariantRuns() {
    opforge::force_variant("");
    EXPECT_GT(calls(), before) << "variant " << name << " did not run";
  }
  int64_t calls() const {
    int64_t n = 0;
    for (const auto& st : opforge::dispatch_stats())
      if (st.variant == name) n += st.calls;
    return n;
  }
  std::string name;
  int64_t before;
  ForcedVariantRuns(const ForcedVariantRuns&) = delete;
  ForcedVariantRuns& operator=(const ForcedVariantRuns&) = delete;
};

}  // namespace ref

// EXPECT_OPFORGE_ERROR(statement, "part", "part", ...): the statement throws opforge::Error and the
// message contains each part.
#define EXPECT_OPFORGE_ERROR(stmt, ...)                             \
  do {                                                              \
    SCOPED_TRACE(#stmt);                                            \
    ::ref::expect_error_impl([&] { (void)(stmt); }, {__VA_ARGS__}); \
  } while (0)
