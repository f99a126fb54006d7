// The elementwise ops as the tests know them: dtypes (as in dsl/opforge/ops/elementwise.hpp),
// input data, the float64 reference and how to call the op through the public API. Shared by
// test_elementwise.cpp and test_variants.cpp. `cast` is handled separately (it is per dtype pair).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "reference.hpp"

namespace ref {

struct EwSpec {
  std::string name;
  int arity = 1;
  std::vector<DType> dtypes;
  std::vector<Data> data;  // per input
  // Reference on the input values; dt is the dtype the op runs at (int div is floor division).
  std::function<double(const std::vector<double>&, DType dt)> fn;
  std::function<Tensor(const std::vector<Tensor>&)> call;
  bool compare = false;         // output is bool
  bool transcendental = false;  // looser float32 tolerance
  int bool_mask = 0;            // inputs that are always bool (where's condition)
  // The op(Tensor, double) overload, for the binary ops that have one.
  std::function<Tensor(const Tensor&, double)> scalar_call;
  std::function<double(DType)> scalar_value;

  // The attribute values `call` passes (clip's bounds, the alphas), for the by-name entry points.
  std::function<std::vector<double>(DType)> attr_values = [](DType) {
    return std::vector<double>{};
  };
  // Whether the op has a backward kernel (dsl/opforge/ops/elementwise.hpp): floating, not a
  // comparison or logic, and not piecewise constant.
  bool differentiable() const {
    bool floats = std::find(dtypes.begin(), dtypes.end(), DType::Float32) != dtypes.end();
    for (const char* zero : {"floor", "ceil", "round", "sign"})
      if (name == zero) return false;
    return floats && !compare;
  }

  DType input_dtype(int i, DType dt) const { return (bool_mask >> i) & 1 ? DType::Bool : dt; }
  DType out_dtype(DType dt) const { return compare ? DType::Bool : dt; }
  Tol tol(DType dt) const { return transcendental ? transcendental_tol(dt) : tol_for(dt); }
};

inline double clip_lo(DType t) { return opforge::is_floating(t) ? -0.5 : -2; }
inline double clip_hi(DType t) { return opforge::is_floating(t) ? 0.75 : 3; }
inline constexpr double kLeakyAlpha = 0.1;
inline constexpr double kEluAlpha = 0.7;

inline const std::vector<EwSpec>& ew_specs() {
  using V = const std::vector<double>&;
  using T = const std::vector<Tensor>&;
  static const std::vector<EwSpec> specs = [] {
    std::vector<EwSpec> s;
    auto unary = [&](std::string name, std::vector<DType> dts, Data d,
                     std::function<double(double)> f, std::function<Tensor(const Tensor&)> call,
                     bool trans = false) {
      EwSpec e;
      e.name = std::move(name);
      e.arity = 1;
      e.dtypes = std::move(dts);
      e.data = {d};
      e.fn = [f](V v, DType) { return f(v[0]); };
      e.call = [call](T in) { return call(in[0]); };
      e.transcendental = trans;
      s.push_back(std::move(e));
    };
    // ---- unary ----
    unary(
        "neg", kNumericTypes, Data::Normal, [](double x) { return -x; },
        [](const Tensor& x) { return opforge::neg(x); });
    unary(
        "abs", kNumericTypes, Data::Normal, [](double x) { return std::fabs(x); },
        [](const Tensor& x) { return opforge::abs(x); });
    unary(
        "exp", kFloatTypes, Data::Normal, [](double x) { return std::exp(x); },
        [](const Tensor& x) { return opforge::exp(x); }, true);
    unary(
        "log", kFloatTypes, Data::Positive, [](double x) { return std::log(x); },
        [](const Tensor& x) { return opforge::log(x); }, true);
    unary(
        "log1p", kFloatTypes, Data::AboveMinusOne, [](double x) { return std::log1p(x); },
        [](const Tensor& x) { return opforge::log1p(x); }, true);
    unary(
        "expm1", kFloatTypes, Data::Normal, [](double x) { return std::expm1(x); },
        [](const Tensor& x) { return opforge::expm1(x); }, true);
    unary(
        "sqrt", kFloatTypes, Data::Positive, [](double x) { return std::sqrt(x); },
        [](const Tensor& x) { return opforge::sqrt(x); });
    unary(
        "rsqrt", kFloatTypes, Data::Positive, [](double x) { return 1 / std::sqrt(x); },
        [](const Tensor& x) { return opforge::rsqrt(x); });
    unary(
        "reciprocal", kFloatTypes, Data::NonZero, [](double x) { return 1 / x; },
        [](const Tensor& x) { return opforge::reciprocal(x); });
    unary(
        "sin", kFloatTypes, Data::Normal, [](double x) { return std::sin(x); },
        [](const Tensor& x) { return opforge::sin(x); }, true);
    unary(
        "cos", kFloatTypes, Data::Normal, [](double x) { return std::cos(x); },
        [](const Tensor& x) { return opforge::cos(x); }, true);
    unary(
        "tanh", kFloatTypes, Data::Normal, [](double x) { return std::tanh(x); },
        [](const Tensor& x) { return opforge::tanh(x); }, true);
    unary(
        "sigmoid", kFloatTypes, Data::Normal, [](double x) { return 1 / (1 + std::exp(-x)); },
        [](const Tensor& x) { return opforge::sigmoid(x); }, true);
    unary(
        "relu", kNumericTypes, Data::Normal, [](double x) { return x < 0 ? 0.0 : x; },
        [](const Tensor& x) { return opforge::relu(x); });
    unary(
        "leaky_relu", kFloatTypes, Data::Normal,
        [](double x) { return x < 0 ? kLeakyAlpha * x : x; },
        [](const Tensor& x) { return opforge::leaky_relu(x, kLeakyAlpha); });
    s.back().attr_values = [](DType) { return std::vector<double>{kLeakyAlpha}; };
    unary(
        "elu", kFloatTypes, Data::Normal,
        [](double x) { return x < 0 ? kEluAlpha * std::expm1(x) : x; },
        [](const Tensor& x) { return opforge::elu(x, kEluAlpha); }, true);
    s.back().attr_values = [](DType) { return std::vector<double>{kEluAlpha}; };
    unary(
        "gelu", kFloatTypes, Data::Normal,
        [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); },
        [](const Tensor& x) { return opforge::gelu(x); }, true);
    unary(
        "softplus", kFloatTypes, Data::Normal,
        [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); },
        [](const Tensor& x) { return opforge::softplus(x); }, true);
    unary(
        "erf", kFloatTypes, Data::Normal, [](double x) { return std::erf(x); },
        [](const Tensor& x) { return opforge::erf(x); }, true);
    unary(
        "floor", kFloatTypes, Data::Quantized, [](double x) { return std::floor(x); },
        [](const Tensor& x) { return opforge::floor(x); });
    unary(
        "ceil", kFloatTypes, Data::Quantized, [](double x) { return std::ceil(x); },
        [](const Tensor& x) { return opforge::ceil(x); });
    // half to even, like std::nearbyint in the default rounding mode
    unary(
        "round", kFloatTypes, Data::Quantized, [](double x) { return std::nearbyint(x); },
        [](const Tensor& x) { return opforge::round(x); });
    unary(
        "sign", kNumericTypes, Data::Quantized,
        [](double x) { return x > 0   ? 1.0
                              : x < 0 ? -1.0
                                      : x; },
        [](const Tensor& x) { return opforge::sign(x); });
    unary(
        "logical_not", kBoolTypes, Data::Bool, [](double x) { return x != 0 ? 0.0 : 1.0; },
        [](const Tensor& x) { return opforge::logical_not(x); });
    {
      EwSpec e;
      e.name = "clip";
      e.dtypes = kNumericTypes;
      e.data = {Data::Normal};
      e.fn = [](V v, DType t) { return std::min(std::max(v[0], clip_lo(t)), clip_hi(t)); };
      e.call = [](T in) {
        return opforge::clip(in[0], clip_lo(in[0].dtype()), clip_hi(in[0].dtype()));
      };
      e.attr_values = [](DType t) { return std::vector<double>{clip_lo(t), clip_hi(t)}; };
      s.push_back(std::move(e));
    }

    // ---- binary ----
    using BinCall = Tensor (*)(const Tensor&, const Tensor&);
    using ScalarCall = Tensor (*)(const Tensor&, double);
    auto binary = [&](std::string name, std::vector<DType> dts, Data d0, Data d1,
                      std::function<double(double, double, DType)> f, BinCall call,
                      ScalarCall scall, std::function<double(DType)> scalar, bool compare = false,
                      bool trans = false) {
      EwSpec e;
      e.name = std::move(name);
      e.arity = 2;
      e.dtypes = std::move(dts);
      e.data = {d0, d1};
      e.fn = [f](V v, DType t) { return f(v[0], v[1], t); };
      e.call = [call](T in) { return call(in[0], in[1]); };
      e.compare = compare;
      e.transcendental = trans;
      if (scall) {
        e.scalar_call = scall;
        e.scalar_value = std::move(scalar);
      }
      s.push_back(std::move(e));
    };
    auto fl_or_int = [](double f, double i) {
      return [f, i](DType t) { return opforge::is_floating(t) ? f : i; };
    };
    binary(
        "pow", kFloatTypes, Data::Positive, Data::Normal,
        [](double a, double b, DType) { return std::pow(a, b); }, opforge::pow, opforge::pow,
        fl_or_int(2.5, 2), false, true);
    binary(
        "add", kNumericTypes, Data::Normal, Data::Normal,
        [](double a, double b, DType) { return a + b; }, opforge::add, opforge::add,
        fl_or_int(2.5, 3));
    binary(
        "sub", kNumericTypes, Data::Normal, Data::Normal,
        [](double a, double b, DType) { return a - b; }, opforge::sub, opforge::sub,
        fl_or_int(-1.25, -4));
    binary(
        "mul", kNumericTypes, Data::Normal, Data::Normal,
        [](double a, double b, DType) { return a * b; }, opforge::mul, opforge::mul,
        fl_or_int(1.5, -3));
    // floats: true division; ints: floor division (Python //), negative divisors included
    binary(
        "div", kNumericTypes, Data::Normal, Data::NonZero,
        [](double a, double b, DType t) {
          return opforge::is_floating(t) ? a / b : floor_div(a, b);
        },
        opforge::div, opforge::div, fl_or_int(1.75, 3));
    binary(
        "maximum", kNumericTypes, Data::Normal, Data::Normal,
        [](double a, double b, DType) { return nan_max(a, b); }, opforge::maximum, opforge::maximum,
        fl_or_int(0.5, 1));
    binary(
        "minimum", kNumericTypes, Data::Normal, Data::Normal,
        [](double a, double b, DType) { return nan_min(a, b); }, opforge::minimum, opforge::minimum,
        fl_or_int(0.5, 1));
    // Python modulo: the result takes the divisor's sign
    binary(
        "mod", kNumericTypes, Data::Normal, Data::NonZero,
        [](double a, double b, DType) { return py_mod(a, b); }, opforge::mod, opforge::mod,
        fl_or_int(1.75, 3));
    binary(
        "eq", kAllTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a == b); }, opforge::eq, opforge::eq,
        fl_or_int(1, 1), true);
    binary(
        "ne", kAllTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a != b); }, opforge::ne, opforge::ne,
        fl_or_int(1, 1), true);
    binary(
        "lt", kNumericTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a < b); }, opforge::lt, opforge::lt,
        fl_or_int(1, 1), true);
    binary(
        "le", kNumericTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a <= b); }, opforge::le, opforge::le,
        fl_or_int(1, 1), true);
    binary(
        "gt", kNumericTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a > b); }, opforge::gt, opforge::gt,
        fl_or_int(1, 1), true);
    binary(
        "ge", kNumericTypes, Data::SmallInt, Data::SmallInt,
        [](double a, double b, DType) { return double(a >= b); }, opforge::ge, opforge::ge,
        fl_or_int(1, 1), true);
    binary(
        "logical_and", kBoolTypes, Data::Bool, Data::Bool,
        [](double a, double b, DType) { return double(a != 0 && b != 0); }, opforge::logical_and,
        nullptr, nullptr);
    binary(
        "logical_or", kBoolTypes, Data::Bool, Data::Bool,
        [](double a, double b, DType) { return double(a != 0 || b != 0); }, opforge::logical_or,
        nullptr, nullptr);
    binary(
        "logical_xor", kBoolTypes, Data::Bool, Data::Bool,
        [](double a, double b, DType) { return double((a != 0) != (b != 0)); },
        opforge::logical_xor, nullptr, nullptr);

    // ---- ternary ----
    {
      EwSpec e;
      e.name = "where";
      e.arity = 3;
      e.dtypes = kAllTypes;
      e.data = {Data::Bool, Data::Normal, Data::Normal};
      e.bool_mask = 1;
      e.fn = [](V v, DType) { return v[0] != 0 ? v[1] : v[2]; };
      e.call = [](T in) { return opforge::where(in[0], in[1], in[2]); };
      s.push_back(std::move(e));
    }
    return s;
  }();
  return specs;
}

inline const EwSpec* find_ew_spec(const std::string& name) {
  for (const auto& s : ew_specs())
    if (s.name == name) return &s;
  return nullptr;
}

// Random inputs for one spec at one dtype, all of `shapes[i]`.
inline std::vector<Tensor> ew_inputs(const EwSpec& s, DType dt, const std::vector<Shape>& shapes,
                                     const std::string& label) {
  std::vector<Tensor> in;
  for (int i = 0; i < s.arity; i++)
    in.push_back(random(shapes[size_t(i)], s.input_dtype(i, dt), s.data[size_t(i)],
                        label + "/" + s.name + "/" + dname(dt) + "/" + std::to_string(i)));
  return in;
}

// The expected result of a spec on these inputs.
inline Expected ew_expected(const EwSpec& s, DType dt, const std::vector<Tensor>& in) {
  return broadcast_eval(in, [&](const std::vector<double>& v) { return s.fn(v, dt); });
}

}  // namespace ref
