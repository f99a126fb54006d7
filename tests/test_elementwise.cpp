// Elementwise ops against the float64 reference: every op at every dtype the DSL defines for it,
// over small, odd, large, 3-D, broadcast, strided, empty and scalar-operand inputs; casts between
// every dtype pair; NaN/Inf propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "elementwise_specs.hpp"
#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

struct EwParam {
  const EwSpec* spec;
  DType dtype;
};
void PrintTo(const EwParam& p, std::ostream* os) {
  *os << p.spec->name << "<" << dname(p.dtype) << ">";
}

std::vector<EwParam> all_ew_params() {
  std::vector<EwParam> out;
  for (const auto& s : ew_specs())
    for (DType t : s.dtypes) out.push_back({&s, t});
  return out;
}

struct Case {
  std::string label;
  std::vector<Tensor> inputs;
};

std::vector<Case> make_cases(const EwSpec& s, DType dt) {
  std::vector<Case> cases;
  auto same_shape = [&](const std::string& label, const Shape& shape) {
    cases.push_back({label, ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), shape), label)});
  };
  same_shape("shape [1]", {1});
  same_shape("shape [7]", {7});
  same_shape("shape [33]", {33});
  same_shape("shape [1023]", {1023});
  same_shape("shape [3, 4, 5]", {3, 4, 5});
  same_shape("empty [0, 3]", {0, 3});

  // broadcasting: [4, 1, 5] with [3, 1] (and [5] for the third input); unary: a stride-0 view
  if (s.arity == 1) {
    auto in = ew_inputs(s, dt, {{4, 1, 5}}, "expand");
    cases.push_back({"expanded view [4, 1, 5] -> [4, 3, 5]", {in[0].expand({4, 3, 5})}});
  } else {
    std::vector<Shape> shapes = {{4, 1, 5}, {3, 1}, {5}};
    shapes.resize(size_t(s.arity));
    cases.push_back(
        {"broadcast [4, 1, 5] with [3, 1] (and [5])", ew_inputs(s, dt, shapes, "broadcast")});
    std::vector<Shape> shapes2 = {{3, 1}, {4, 1, 5}, {1}};
    shapes2.resize(size_t(s.arity));
    cases.push_back(
        {"broadcast [3, 1] with [4, 1, 5] (and [1])", ew_inputs(s, dt, shapes2, "broadcast2")});
  }

  // non-contiguous views: transposes, step-2 slices, and a mix of both
  {
    auto base = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{7, 5}), "transpose");
    Case c{"transposed views [7, 5] -> [5, 7]", {}};
    for (auto& t : base) c.inputs.push_back(t.transpose(0, 1));
    cases.push_back(c);
  }
  {
    auto base = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{5, 14}), "slice");
    Case c{"step-2 slices of [5, 14] -> [5, 7]", {}};
    for (auto& t : base) c.inputs.push_back(t.slice(1, 0, 14, 2));
    cases.push_back(c);
  }
  {
    auto tr = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{7, 5}), "mix-t");
    auto sl = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{5, 14}), "mix-s");
    Case c{"mixed transposed / sliced inputs", {}};
    for (int i = 0; i < s.arity; i++)
      c.inputs.push_back(i % 2 == 0 ? tr[size_t(i)].transpose(0, 1)
                                    : sl[size_t(i)].slice(1, 1, 14, 2));
    cases.push_back(c);
  }
  {
    auto base = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{100}), "slice1d");
    Case c{"1-D slice [-90:97:3] of [100]", {}};
    for (auto& t : base) c.inputs.push_back(t.slice(0, -90, 97, 3));
    cases.push_back(c);
  }
  return cases;
}

class ElementwiseTest : public ::testing::TestWithParam<EwParam> {};

TEST_P(ElementwiseTest, MatchesReference) {
  const EwSpec& s = *GetParam().spec;
  DType dt = GetParam().dtype;
  for (const Case& c : make_cases(s, dt)) {
    SCOPED_TRACE(s.name + " at " + dname(dt) + ", " + c.label);
    Expected want = ew_expected(s, dt, c.inputs);
    Tensor got;
    try {
      got = s.call(c.inputs);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    expect_close(got, want, s.out_dtype(dt), s.tol(dt));
  }
}

// The op(Tensor, double) overloads: the scalar takes the tensor's dtype when it fits it.
TEST_P(ElementwiseTest, ScalarOperand) {
  const EwSpec& s = *GetParam().spec;
  DType dt = GetParam().dtype;
  if (!s.scalar_call || dt == DType::Bool) {
    // No scalar overload for this op/dtype: the tensor-tensor form must still work.
    auto in = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), Shape{9}), "noscalar");
    expect_close(s.call(in), ew_expected(s, dt, in), s.out_dtype(dt), s.tol(dt));
    return;
  }
  double c = s.scalar_value(dt);
  for (Shape shape : {Shape{33}, Shape{3, 4, 5}, Shape{0, 3}}) {
    SCOPED_TRACE(s.name + "(x, " + std::to_string(c) + ") at " + dname(dt) + ", shape " +
                 sstr(shape));
    Tensor x = random(shape, dt, s.data[0], "scalar/" + s.name + "/" + dname(dt));
    Expected want = broadcast_eval({x}, [&](const std::vector<double>& v) {
      return s.fn({v[0], c}, dt);
    });
    Tensor got;
    try {
      got = s.scalar_call(x, c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    expect_close(got, want, s.out_dtype(dt), s.tol(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, ElementwiseTest, ::testing::ValuesIn(all_ew_params()),
                         [](const ::testing::TestParamInfo<EwParam>& i) {
                           return i.param.spec->name + "_" + dname(i.param.dtype);
                         });

// ---- cast: every (from, to) pair, including from == to ----

struct CastParam {
  DType from, to;
};
void PrintTo(const CastParam& p, std::ostream* os) { *os << dname(p.from) << "->" << dname(p.to); }

std::vector<CastParam> all_cast_params() {
  std::vector<CastParam> out;
  for (DType a : kAllTypes)
    for (DType b : kAllTypes) out.push_back({a, b});
  return out;
}

class CastTest : public ::testing::TestWithParam<CastParam> {};

TEST_P(CastTest, MatchesReference) {
  DType from = GetParam().from, to = GetParam().to;
  std::vector<std::pair<std::string, Tensor>> cases;
  for (Data d : {Data::Quantized, Data::Normal}) {
    std::string tag = d == Data::Quantized ? "quantized" : "normal";
    for (Shape shape : {Shape{1}, Shape{33}, Shape{1023}, Shape{3, 4, 5}, Shape{0, 3}})
      cases.push_back({tag + " " + sstr(shape),
                       random(shape, from, d, "cast/" + tag + sstr(shape) + dname(from))});
    cases.push_back({tag + " transposed [7, 5]",
                     random({7, 5}, from, d, "cast/t" + tag + dname(from)).transpose(0, 1)});
    cases.push_back({tag + " step-2 slice",
                     random({5, 14}, from, d, "cast/s" + tag + dname(from)).slice(1, 1, 14, 2)});
  }
  for (auto& [label, x] : cases) {
    SCOPED_TRACE("cast " + dname(from) + " -> " + dname(to) + ", " + label);
    Expected want =
        broadcast_eval({x}, [&](const std::vector<double>& v) { return cast_value(v[0], to); });
    Tensor got;
    try {
      got = opforge::cast(x, to);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    expect_close(got, want, to, tol_for(to));
  }
}

INSTANTIATE_TEST_SUITE_P(AllPairs, CastTest, ::testing::ValuesIn(all_cast_params()),
                         [](const ::testing::TestParamInfo<CastParam>& i) {
                           return dname(i.param.from) + "_to_" + dname(i.param.to);
                         });

// ---- NaN / Inf ----

class ElementwiseSpecial : public ::testing::TestWithParam<DType> {};

TEST_P(ElementwiseSpecial, NanAndInfPropagate) {
  DType dt = GetParam();
  const double inf = std::numeric_limits<double>::infinity(),
               nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = make({inf, -inf, nan, 0, 2}, {5}, dt);
  Tensor one = Tensor::ones({5}, dt);
  Tol tt = transcendental_tol(dt);
  {
    SCOPED_TRACE("exp");
    expect_close(opforge::exp(x), {inf, 0, nan, 1, std::exp(2.0)}, {5}, dt, tt);
  }
  {
    SCOPED_TRACE("add(x, 1.0)");
    expect_close(opforge::add(x, 1.0), {inf, -inf, nan, 1, 3}, {5}, dt);
  }
  {
    SCOPED_TRACE("add(x, ones)");
    expect_close(opforge::add(x, one), {inf, -inf, nan, 1, 3}, {5}, dt);
  }
  {
    SCOPED_TRACE("maximum(x, ones)");
    expect_close(opforge::maximum(x, one), {inf, 1, nan, 1, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("maximum(ones, x)");
    expect_close(opforge::maximum(one, x), {inf, 1, nan, 1, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("minimum(x, ones)");
    expect_close(opforge::minimum(x, one), {1, -inf, nan, 0, 1}, {5}, dt);
  }
  {
    SCOPED_TRACE("minimum(ones, x)");
    expect_close(opforge::minimum(one, x), {1, -inf, nan, 0, 1}, {5}, dt);
  }
  {
    SCOPED_TRACE("maximum(x, 1.0)");
    expect_close(opforge::maximum(x, 1.0), {inf, 1, nan, 1, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("relu");
    expect_close(opforge::relu(x), {inf, 0, nan, 0, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("neg");
    expect_close(opforge::neg(x), {-inf, inf, nan, 0, -2}, {5}, dt);
  }
  {
    SCOPED_TRACE("abs");
    expect_close(opforge::abs(x), {inf, inf, nan, 0, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("sigmoid");
    expect_close(opforge::sigmoid(x), {1, 0, nan, 0.5, 1 / (1 + std::exp(-2.0))}, {5}, dt, tt);
  }
  {
    SCOPED_TRACE("tanh");
    expect_close(opforge::tanh(x), {1, -1, nan, 0, std::tanh(2.0)}, {5}, dt, tt);
  }
  {
    SCOPED_TRACE("erf");
    expect_close(opforge::erf(x), {1, -1, nan, 0, std::erf(2.0)}, {5}, dt, tt);
  }
  {
    SCOPED_TRACE("softplus");
    expect_close(opforge::softplus(x), {inf, 0, nan, std::log(2.0), std::log1p(std::exp(2.0))}, {5},
                 dt, tt);
  }
  {
    SCOPED_TRACE("floor");
    expect_close(opforge::floor(x), {inf, -inf, nan, 0, 2}, {5}, dt);
  }
  {
    SCOPED_TRACE("clip");
    expect_close(opforge::clip(x, -1, 1), {1, -1, nan, 0, 1}, {5}, dt);
  }
  {
    SCOPED_TRACE("mul(x, 0.0)");
    expect_close(opforge::mul(x, 0.0), {nan, nan, nan, 0, 0}, {5}, dt);
  }
  {
    SCOPED_TRACE("eq / ne with NaN");
    Tensor n = make({nan, nan, 1}, {3}, dt);
    Tensor m = make({nan, 1, 1}, {3}, dt);
    expect_close(opforge::eq(n, m), {0, 0, 1}, {3}, DType::Bool);
    expect_close(opforge::ne(n, m), {1, 1, 0}, {3}, DType::Bool);
    expect_close(opforge::lt(n, m), {0, 0, 0}, {3}, DType::Bool);
  }
  {
    SCOPED_TRACE("log / sqrt / reciprocal / div at the edges of their domains");
    Tensor d = make({0, inf, nan, -1}, {4}, dt);
    expect_close(opforge::log(d), {-inf, inf, nan, nan}, {4}, dt, tt);
    expect_close(opforge::sqrt(d), {0, inf, nan, nan}, {4}, dt);
    expect_close(opforge::reciprocal(make({0, inf, -inf}, {3}, dt)), {inf, 0, -0.0}, {3}, dt);
    expect_close(opforge::div(make({1, -1, 0}, {3}, dt), make({0, 0, 0}, {3}, dt)),
                 {inf, -inf, nan}, {3}, dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Floats, ElementwiseSpecial,
                         ::testing::Values(DType::Float32, DType::Float64),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- family entry point and dtype promotion ----

TEST(ElementwiseFamily, ByNameMatchesTheTypedFunctions) {
  Tensor a = random({4, 6}, DType::Float32, Data::Normal, "family/a");
  Tensor b = random({6}, DType::Float32, Data::Normal, "family/b");
  {
    SCOPED_TRACE("elementwise(\"add\")");
    expect_close(opforge::elementwise("add", {a, b}),
                 broadcast_eval({a, b}, [](const std::vector<double>& v) { return v[0] + v[1]; }),
                 DType::Float32);
  }
  {
    SCOPED_TRACE("elementwise(\"leaky_relu\", alpha 0.2)");
    expect_close(
        opforge::elementwise("leaky_relu", {a}, {0.2}),
        broadcast_eval({a},
                       [](const std::vector<double>& v) { return v[0] < 0 ? 0.2 * v[0] : v[0]; }),
        DType::Float32);
  }
  {
    SCOPED_TRACE("elementwise(\"clip\", -0.5, 0.25)");
    expect_close(
        opforge::elementwise("clip", {a}, {-0.5, 0.25}),
        broadcast_eval({a},
                       [](const std::vector<double>& v) { return std::clamp(v[0], -0.5, 0.25); }),
        DType::Float32);
  }
}

TEST(ElementwisePromotion, MixedDtypesPromote) {
  Tensor i = random({3, 4}, DType::Int32, Data::Normal, "promo/i");
  Tensor f = random({4}, DType::Float64, Data::Normal, "promo/f");
  Tensor g = random({3, 4}, DType::Int64, Data::Normal, "promo/g");
  auto plus = [](const std::vector<double>& v) { return v[0] + v[1]; };
  {
    SCOPED_TRACE("int32 + float64 -> float64");
    expect_close(opforge::add(i, f), broadcast_eval({i, f}, plus), DType::Float64);
  }
  {
    SCOPED_TRACE("int32 + int64 -> int64");
    expect_close(opforge::add(i, g), broadcast_eval({i, g}, plus), DType::Int64);
  }
  {
    SCOPED_TRACE("int32 + 2.5 -> float (the scalar does not fit int32)");
    Tensor r = opforge::add(i, 2.5);
    EXPECT_TRUE(opforge::is_floating(r.dtype())) << dname(r.dtype());
    expect_close(r, broadcast_eval({i}, [](const std::vector<double>& v) { return v[0] + 2.5; }),
                 r.dtype());
  }
}

}  // namespace

// ---- the CPU hand schedule's layouts ----

// Each branch of the hand schedule (schedules/elementwise.hpp) forced: biases along rows and along
// columns (stride-0 inputs), transposed inputs in 64 x 64 tiles with ragged edges, a strided
// slice, a three-input op with one broadcast input, and the copy a transpose's contiguous() makes.
TEST(ElementwiseLayouts, HandScheduleMatchesTheReferenceInEveryBranch) {
  auto plus = [](const std::vector<double>& v) { return v[0] + v[1]; };
  for (DType dt : {DType::Int32, DType::Float32, DType::Float64}) {
    auto r = [&](const Shape& s, const std::string& label) {
      return random(s, dt, Data::Normal, "layouts/" + label + dname(dt));
    };
    struct Case {
      std::string label;
      Tensor a, b;
    };
    const Tensor x = r({70, 133}, "x");
    const std::vector<Case> cases = {{"bias along rows", x, r({133}, "row bias")},
                                     {"bias along columns", x, r({70, 1}, "column bias")},
                                     {"short rows", r({3000, 5}, "short"), r({5}, "short bias")},
                                     {"transposed", r({133, 70}, "t").transpose(0, 1), x},
                                     {"both transposed, 3-D", r({2, 133, 70}, "t3").transpose(1, 2),
                                      r({2, 133, 70}, "u3").transpose(1, 2)},
                                     {"step-2 slice", r({70, 266}, "s").slice(1, 0, 266, 2), x},
                                     {"scalar broadcast", x, r({1}, "scalar")}};
    for (const Case& c : cases) {
      SCOPED_TRACE("add at " + dname(dt) + ", " + c.label);
      Expected want = broadcast_eval({c.a, c.b}, plus);
      Tensor got;
      {
        ForcedVariantRuns force("manual");
        got = opforge::add(c.a, c.b);
      }
      expect_close(got, want, dt);
    }
    {
      SCOPED_TRACE("where with a broadcast condition at " + dname(dt));
      Tensor cond = opforge::gt(r({133}, "cond"), Tensor::zeros({133}, dt));
      Tensor alt = r({70, 133}, "alt");
      Expected want = broadcast_eval(
          {cond, x, alt}, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; });
      Tensor got;
      {
        ForcedVariantRuns force("manual");
        got = opforge::where(cond, x, alt);
      }
      expect_close(got, want, dt);
    }
    {
      SCOPED_TRACE("contiguous copy of a transpose at " + dname(dt));
      Tensor t = r({133, 70}, "copy").transpose(0, 1);
      Expected want = broadcast_eval({t}, [](const std::vector<double>& v) { return v[0]; });
      Tensor got;
      {
        ForcedVariantRuns force("manual");
        got = t.contiguous();
      }
      expect_close(got, want, dt);
    }
  }
}
