// Reductions against the float64 reference: sum, mean, prod, max, min, logsumexp, var over single
// axes, several non-adjacent axes, all axes, negative axes, keepdims on and off; argmax/argmin;
// softmax/log_softmax; layer_norm. Dtypes as in dsl/opforge/ops/reduction.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

struct AxisCase {
  std::string label;
  Tensor x;
  std::vector<int> axes;
  bool keepdims;
};

// The shapes and axis sets every reduce op runs over.
std::vector<AxisCase> axis_cases(DType dt, Data d, const std::string& tag) {
  std::vector<AxisCase> out;
  auto add = [&](const std::string& label, const Tensor& x, std::vector<int> axes) {
    for (bool keep : {false, true})
      out.push_back({label + (keep ? ", keepdims" : ""), x, axes, keep});
  };
  auto r = [&](const Shape& s, const std::string& name) {
    return random(s, dt, d, tag + "/" + name);
  };
  auto axes_str = [](const std::vector<int>& a) {
    std::string s = "{";
    for (size_t i = 0; i < a.size(); i++) s += (i ? "," : "") + std::to_string(a[i]);
    return s + "}";
  };
  auto both = [&](const Shape& s, std::vector<int> axes) {
    add("shape " + sstr(s) + " axes " + axes_str(axes), r(s, sstr(s)), axes);
  };
  both({1}, {0});
  both({7}, {0});
  both({33}, {-1});
  both({1023}, {0});
  both({1023}, {});
  both({33, 7}, {0});
  both({33, 7}, {1});
  both({33, 7}, {});
  both({4, 5, 6, 7}, {1});
  both({4, 5, 6, 7}, {0, 2});    // non-adjacent
  both({4, 5, 6, 7}, {1, 3});    // non-adjacent, includes the innermost
  both({4, 5, 6, 7}, {-1, -3});  // negative
  both({4, 5, 6, 7}, {3, 0});    // unsorted
  both({4, 5, 6, 7}, {0, 1, 2, 3});
  both({4, 5, 6, 7}, {});
  both({3, 1023}, {1});
  both({1023, 3}, {0});
  {
    Tensor base = r({6, 8, 5}, "transpose");
    add("transposed [6, 8, 5] -> [5, 8, 6] axes {1}", base.transpose(0, 2), {1});
    add("transposed [6, 8, 5] -> [5, 8, 6] axes {0, 2}", base.transpose(0, 2), {0, 2});
  }
  {
    Tensor base = r({5, 66}, "slice");
    add("step-2 slice [5, 66] -> [5, 33] axes {1}", base.slice(1, 0, 66, 2), {1});
    add("step-2 slice [5, 66] -> [5, 33] axes {0}", base.slice(1, 1, 66, 2), {0});
  }
  return out;
}

using ReduceCall = std::function<Tensor(const Tensor&, const std::vector<int>&, bool)>;

struct ReduceSpec {
  std::string name;
  std::vector<DType> dtypes;
  Data data;
  ReduceCall call;
  ReduceFn fn;
  std::function<DType(DType)> out;
  bool transcendental = false;
  double ddof = 0;  // var only: skip reductions over fewer than ddof + 1 elements
};

DType same(DType t) { return t; }
DType widen(DType t) { return opforge::is_floating(t) ? t : DType::Int64; }

std::vector<ReduceSpec> reduce_specs() {
  using V = const std::vector<double>&;
  using A = const std::vector<int>&;
  return {
      {"sum", kNumericTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::sum(x, a, k); }, fn::sum, widen},
      {"mean", kFloatTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::mean(x, a, k); }, fn::mean, same},
      {"prod", kNumericTypes, Data::NearOne,
       [](const Tensor& x, A a, bool k) { return opforge::prod(x, a, k); }, fn::prod, widen},
      {"max", kNumericTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::max(x, a, k); }, fn::max, same},
      {"min", kNumericTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::min(x, a, k); }, fn::min, same},
      {"logsumexp", kFloatTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::logsumexp(x, a, k); }, fn::logsumexp,
       same, true},
      {"var_ddof0", kFloatTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::var(x, a, k, 0); },
       [](V v) { return fn::var(v, 0); }, same},
      {"var_ddof1", kFloatTypes, Data::Normal,
       [](const Tensor& x, A a, bool k) { return opforge::var(x, a, k, 1); },
       [](V v) { return fn::var(v, 1); }, same, false, 1},
  };
}

struct RedParam {
  std::string op;
  DType dtype;
};
void PrintTo(const RedParam& p, std::ostream* os) { *os << p.op << "<" << dname(p.dtype) << ">"; }

std::vector<RedParam> reduce_params() {
  std::vector<RedParam> out;
  for (const auto& s : reduce_specs())
    for (DType t : s.dtypes) out.push_back({s.name, t});
  return out;
}

class ReduceTest : public ::testing::TestWithParam<RedParam> {};

TEST_P(ReduceTest, MatchesReference) {
  ReduceSpec spec;
  for (auto& s : reduce_specs())
    if (s.name == GetParam().op) spec = s;
  ASSERT_FALSE(spec.name.empty());
  DType dt = GetParam().dtype;
  for (const AxisCase& c : axis_cases(dt, spec.data, spec.name + dname(dt))) {
    int64_t k = reduced_count(c.x.shape(), c.axes);
    if (k <= int64_t(spec.ddof)) continue;  // var with ddof 1 over one element divides by zero
    SCOPED_TRACE(spec.name + " at " + dname(dt) + ", " + c.label);
    Expected want = reduce(dense(c.x), c.axes, c.keepdims, spec.fn);
    Tensor got;
    try {
      got = spec.call(c.x, c.axes, c.keepdims);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    DType out = spec.out(dt);
    Tol tol = accum_tol(out, k);
    if (spec.transcendental) tol = loosest(tol, transcendental_tol(out));
    expect_close(got, want, out, tol);
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, ReduceTest, ::testing::ValuesIn(reduce_params()),
                         [](const ::testing::TestParamInfo<RedParam>& i) {
                           return i.param.op + "_" + dname(i.param.dtype);
                         });

TEST(Reduction, Int32SumAndProdAccumulateInInt64) {
  // 1023 * 3e6 overflows int32; the int64 result must not.
  Tensor x = Tensor::full({1023}, 3e6, DType::Int32);
  expect_close(opforge::sum(x), {1023 * 3e6}, {}, DType::Int64);
  Tensor y = make({65536, 65536, 3}, {3}, DType::Int32);
  expect_close(opforge::prod(y), {65536.0 * 65536.0 * 3}, {}, DType::Int64);
}

// A float32 running sum stops growing at 2^24 times its addend (20M ones would sum to 16777216):
// sums accumulate wider. Each CPU variant of sum on rows that start at 2^24, then the ops built on
// sums over 20M elements.
TEST(Reduction, LongFloat32SumsDoNotStall) {
  std::vector<double> rows(64 * 4096, 1.0);
  for (size_t i = 0; i < rows.size(); i += 4096) rows[i] = 16777216.0;
  Tensor x = make(rows, {64, 4096}, DType::Float32);
  for (const auto& v : opforge::op_info("sum").group("float32").variants) {
    if (v.kind != opforge::DeviceKind::cpu) continue;
    SCOPED_TRACE(v.name);
    std::vector<float> got;
    {
      ForcedVariantRuns force(v.name);
      got = opforge::sum(x, {1}).to_vector<float>();
    }
    for (float r : got) EXPECT_NEAR(r, 16777216.0 + 4095, 1.0);
  }
  const int64_t n = 20'000'000;
  opforge::Generator g(5);
  Tensor r = Tensor::rand({n}, DType::Float32, g);
  std::vector<float> rv = r.to_vector<float>();
  double want = 0, want_sq = 0;
  for (float v : rv) want += v;
  for (float v : rv) want_sq += (v - want / double(n)) * (v - want / double(n));
  EXPECT_EQ(opforge::sum(Tensor::ones({n})).item(), double(n));
  EXPECT_NEAR(opforge::sum(r).item(), want, 1e-6 * want);
  EXPECT_EQ(opforge::mean(Tensor::ones({n})).item(), 1.0);
  EXPECT_NEAR(opforge::mean(r).item(), want / double(n), 1e-6);
  EXPECT_NEAR(opforge::var(r).item(), want_sq / double(n), 1e-6 * want_sq / double(n));
  Tensor sm = opforge::softmax(Tensor::zeros({n}), 0);
  EXPECT_NEAR(sm.to_vector<float>()[12345], 1.0 / double(n), 1e-6 / double(n));
}

TEST(Reduction, SumOfAnEmptyAxisIsZero) {
  Tensor x = Tensor::zeros({0, 3}, DType::Float32);
  expect_close(opforge::sum(x, {0}), {0, 0, 0}, {3}, DType::Float32);
  expect_close(opforge::sum(x, {1}), {}, {0}, DType::Float32);
}

TEST(Reduction, MaxMinPropagateNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor x = make({1, nan, 3, 4, 5, 6}, {2, 3}, dt);
    expect_close(opforge::max(x, {1}), {nan, 6}, {2}, dt);
    expect_close(opforge::min(x, {1}), {nan, 4}, {2}, dt);
    expect_close(opforge::max(x), {nan}, {}, dt);
  }
}

TEST(Reduction, LogsumexpIsStableForLargeInputs) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor x = make({1000, 1000, -1000, 0}, {2, 2}, dt);
    expect_close(opforge::logsumexp(x, {1}), {1000 + std::log(2.0), std::log1p(std::exp(-1000.0))},
                 {2}, dt, transcendental_tol(dt));
  }
}

// ---- the CPU hand schedule's layouts ----

// Shapes for each branch of the hand schedule (schedules/cpu_manual.hpp): contiguous rows (tails
// of the vector lanes), rows split into parallel chunks (few rows over 2^17 elements), columns
// (vector and block tails, one block exactly), and strides it does not specialise for.
struct LayoutCase {
  std::string label;
  Tensor x;
  int axis;
};
std::vector<LayoutCase> layout_cases(DType dt, Data d, const std::string& tag, bool huge) {
  auto r = [&](const Shape& s) { return random(s, dt, d, tag + sstr(s)); };
  std::vector<LayoutCase> out = {{"rows", r({5, 1023}), 1},
                                 {"columns", r({3, 17, 1061}), 1},
                                 {"one block of columns", r({40, 1024}), 0},
                                 {"one vector of columns", r({9, 16}), 0},
                                 {"transposed", r({33, 20}).transpose(0, 1), 1}};
  if (huge) {
    out.push_back({"chunked rows", r({2, 150001}), 1});
    out.push_back({"chunked whole tensor", r({270001}), 0});
  }
  return out;
}

TEST(ReductionLayouts, HandScheduleMatchesTheReferenceInEveryBranch) {
  for (const ReduceSpec& spec : reduce_specs())
    for (DType dt : spec.dtypes) {
      // A product over 2^17 elements leaves every dtype's range.
      for (const LayoutCase& c : layout_cases(dt, spec.data, spec.name, spec.name != "prod")) {
        SCOPED_TRACE(spec.name + " at " + dname(dt) + ", " + c.label);
        Expected want = reduce(dense(c.x), {c.axis}, false, spec.fn);
        Tensor got;
        {
          ForcedVariantRuns force("manual");
          got = spec.call(c.x, {c.axis}, false);
        }
        int64_t k = c.x.shape()[size_t(c.axis)];
        Tol tol = accum_tol(spec.out(dt), k);
        if (spec.transcendental) tol = loosest(tol, transcendental_tol(spec.out(dt)));
        expect_close(got, want, spec.out(dt), tol);
      }
      if (spec.name != "max") continue;  // argmax along: its lanes would lose the first index
      for (const LayoutCase& c : layout_cases(dt, Data::Distinct, "arg", true)) {
        SCOPED_TRACE("argmax at " + dname(dt) + ", " + c.label);
        ForcedVariantRuns force("manual");
        expect_close(opforge::argmax(c.x, c.axis), reduce(dense(c.x), {c.axis}, false, fn::argmax),
                     DType::Int64);
      }
    }
  for (DType dt : kFloatTypes)
    for (const LayoutCase& c : layout_cases(dt, Data::Normal, "softmax", false))
      for (bool log : {false, true}) {
        SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " at " + dname(dt) + ", " +
                     c.label);
        Expected want = softmax(dense(c.x), c.axis, log);
        Tensor got;
        {
          ForcedVariantRuns force("manual");
          got = log ? opforge::log_softmax(c.x, c.axis) : opforge::softmax(c.x, c.axis);
        }
        expect_close(got, want, dt,
                     loosest(accum_tol(dt, c.x.shape()[size_t(c.axis)]), transcendental_tol(dt)));
      }
}

// ---- argmax / argmin ----

class ArgTest : public ::testing::TestWithParam<DType> {};

TEST_P(ArgTest, AlongAnAxisAndFlattened) {
  DType dt = GetParam();
  struct C {
    Shape shape;
    std::optional<int> axis;
  };
  std::vector<C> cases = {{{1}, 0},
                          {{7}, 0},
                          {{33}, std::nullopt},
                          {{1023}, 0},
                          {{1023}, -1},
                          {{33, 7}, 0},
                          {{33, 7}, 1},
                          {{33, 7}, std::nullopt},
                          {{4, 5, 6}, 1},
                          {{4, 5, 6}, -1},
                          {{4, 5, 6}, std::nullopt}};
  for (bool is_max : {true, false})
    for (const auto& c : cases)
      for (bool keep : {false, true}) {
        std::string label = std::string(is_max ? "argmax" : "argmin") + " shape " + sstr(c.shape) +
                            " axis " + (c.axis ? std::to_string(*c.axis) : "none") +
                            (keep ? " keepdims" : "");
        SCOPED_TRACE(label + " at " + dname(dt));
        Tensor x = random(c.shape, dt, Data::Distinct, label + dname(dt));
        std::vector<int> axes = c.axis ? std::vector<int>{*c.axis} : std::vector<int>{};
        Expected want = reduce(dense(x), axes, keep, is_max ? fn::argmax : fn::argmin);
        Tensor got = is_max ? opforge::argmax(x, c.axis, keep) : opforge::argmin(x, c.axis, keep);
        expect_close(got, want, DType::Int64);
      }
  // a non-contiguous input
  Tensor base = random({6, 9}, dt, Data::Distinct, "arg/transposed" + dname(dt));
  Tensor xt = base.transpose(0, 1);
  SCOPED_TRACE("transposed input");
  expect_close(opforge::argmax(xt, 1), reduce(dense(xt), {1}, false, fn::argmax), DType::Int64);
  expect_close(opforge::argmin(xt, 0), reduce(dense(xt), {0}, false, fn::argmin), DType::Int64);
}

TEST_P(ArgTest, TiesGoToTheFirstIndex) {
  DType dt = GetParam();
  Tensor x = make({1, 3, 3, 0, 0, 2}, {6}, dt);
  EXPECT_EQ(opforge::argmax(x).item(), 1);
  EXPECT_EQ(opforge::argmin(x).item(), 3);
}

INSTANTIATE_TEST_SUITE_P(Numeric, ArgTest, ::testing::ValuesIn(kNumericTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- softmax / log_softmax ----

class NormalizeTest : public ::testing::TestWithParam<DType> {};

TEST_P(NormalizeTest, SoftmaxAndLogSoftmax) {
  DType dt = GetParam();
  struct C {
    std::string label;
    Tensor x;
    int axis;
  };
  std::vector<C> cases;
  for (Shape s :
       {Shape{1}, Shape{7}, Shape{33}, Shape{1023}, Shape{4, 5, 6}, Shape{3, 1023}, Shape{33, 7}})
    for (int axis : {-1, 0})
      cases.push_back({"shape " + sstr(s), random(s, dt, Data::Normal, "softmax" + sstr(s)), axis});
  cases.push_back({"shape [4, 5, 6]", random({4, 5, 6}, dt, Data::Normal, "softmax mid"), 1});
  Tensor base = random({6, 8, 5}, dt, Data::Normal, "softmax t");
  cases.push_back({"transposed [5, 8, 6]", base.transpose(0, 2), -1});
  cases.push_back({"transposed [5, 8, 6]", base.transpose(0, 2), 0});
  cases.push_back({"step-2 slice [5, 33]",
                   random({5, 66}, dt, Data::Normal, "softmax s").slice(1, 0, 66, 2), -1});
  for (const auto& c : cases)
    for (bool log : {false, true}) {
      SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " at " + dname(dt) + ", " +
                   c.label + " axis " + std::to_string(c.axis));
      Expected want = softmax(dense(c.x), c.axis, log);
      Tensor got = log ? opforge::log_softmax(c.x, c.axis) : opforge::softmax(c.x, c.axis);
      int ax = c.axis < 0 ? c.axis + c.x.dim() : c.axis;
      expect_close(got, want, dt,
                   loosest(accum_tol(dt, c.x.shape()[size_t(ax)]), transcendental_tol(dt)));
    }
}

TEST_P(NormalizeTest, SoftmaxHandlesLargeInputs) {
  DType dt = GetParam();
  Tensor x = make({1000, 1000, -1000, 0}, {2, 2}, dt);
  expect_close(opforge::softmax(x, -1), {0.5, 0.5, 0, 1}, {2, 2}, dt);
  expect_close(opforge::log_softmax(x, -1), {-std::log(2.0), -std::log(2.0), -1000, 0}, {2, 2}, dt,
               transcendental_tol(dt));
}

TEST_P(NormalizeTest, LayerNorm) {
  DType dt = GetParam();
  struct C {
    Shape shape;
    int ndims;
  };
  std::vector<C> cases = {{{4, 5, 6}, 1}, {{4, 5, 6}, 2}, {{3, 1023}, 1},
                          {{7}, 1},       {{33, 7}, 2},   {{2, 1}, 1}};
  for (const auto& c : cases)
    for (int affine = 0; affine < 3; affine++) {  // 0: none, 1: weight only, 2: weight and bias
      Shape norm(c.shape.end() - c.ndims, c.shape.end());
      std::string label = "layer_norm shape " + sstr(c.shape) + " over " + sstr(norm) +
                          (affine == 0   ? ""
                           : affine == 1 ? " with weight"
                                         : " with weight and bias");
      SCOPED_TRACE(label + " at " + dname(dt));
      Tensor x = random(c.shape, dt, Data::Normal, label);
      Tensor w = affine >= 1 ? random(norm, dt, Data::Normal, label + "w") : Tensor();
      Tensor b = affine >= 2 ? random(norm, dt, Data::Normal, label + "b") : Tensor();
      Expected want =
          layer_norm(dense(x), c.ndims, w.defined() ? w.to_double_vector() : std::vector<double>{},
                     b.defined() ? b.to_double_vector() : std::vector<double>{}, 1e-5);
      Tensor got = opforge::layer_norm(x, norm, w, b);
      expect_close(got, want, dt, loosest(accum_tol(dt, numel(norm)), transcendental_tol(dt)));
    }
  // eps and a non-contiguous input
  Tensor base = random({6, 5}, dt, Data::Normal, "layer_norm t");
  Tensor xt = base.transpose(0, 1);
  SCOPED_TRACE("layer_norm transposed input, eps 0.5");
  expect_close(opforge::layer_norm(xt, {6}, {}, {}, 0.5), layer_norm(dense(xt), 1, {}, {}, 0.5), dt,
               transcendental_tol(dt));
}

INSTANTIATE_TEST_SUITE_P(Floats, NormalizeTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- the family entry point by name ----

TEST(ReductionFamily, ByNameMatchesTheTypedFunctions) {
  Tensor x = random({5, 6, 7}, DType::Float64, Data::Normal, "family");
  expect_close(opforge::reduction("sum", x, {0, 2}, false),
               reduce(dense(x), {0, 2}, false, fn::sum), DType::Float64);
  expect_close(
      opforge::reduction("var", x, {1}, true, {1.0}),
      reduce(dense(x), {1}, true, [](const std::vector<double>& v) { return fn::var(v, 1); }),
      DType::Float64);
}

}  // namespace
