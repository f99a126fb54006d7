// Every generated kernel variant, forced one at a time and checked against the float64 reference:
// for each registered op, dtype group and variant, force_variant(name), run the op through the
// public API at a shape that meets the variant's minimum call extents, and compare. The dispatch
// statistics must show that the forced variant really ran.
//
// An op without an entry in this file's table fails (EveryRegisteredOpHasAVariantTest and the
// op's own parameterised test), so a new op cannot ship untested.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "elementwise_specs.hpp"
#include "gradient_check.hpp"
#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;
using opforge::KernelGroup;
using opforge::OpInfo;
using opforge::VariantInfo;

// Ops that test files register for their own purposes (test_dispatch.cpp's fake kernels are
// named test_*); they have no real kernels to check.
bool is_test_op(const std::string& name) { return name.rfind("test_", 0) == 0; }

// Forces a variant of one op for its lifetime and restores the previous setting afterwards. Only
// that op: the copies an op makes of its strided inputs are placed as usual.
class ForcedVariant {
 public:
  ForcedVariant(const std::string& name, const std::string& op)
      : previous_(opforge::forced_variant()) {
    opforge::force_variant(name, op);
  }
  ~ForcedVariant() { opforge::force_variant(previous_); }
  ForcedVariant(const ForcedVariant&) = delete;
  ForcedVariant& operator=(const ForcedVariant&) = delete;

 private:
  std::string previous_;
};

int64_t calls_of(const std::string& op, const std::string& dtype_key, const std::string& variant) {
  int64_t n = 0;
  for (const auto& s : opforge::dispatch_stats())
    if (s.op == op && s.dtype == dtype_key && s.variant == variant) n += s.calls;
  return n;
}

// Runs f with the variant forced (inputs must be prepared before, checks done after, so that no
// other kernel runs under the force), and checks that the variant was dispatched.
Tensor run_forced(const KernelGroup& g, const VariantInfo& v, const std::function<Tensor()>& f) {
  const std::string& op = g.op->name;
  int64_t before = calls_of(op, g.dtype_key, v.name);
  Tensor out;
  try {
    ForcedVariant force(v.name, op);
    // A GPU variant runs on the first device of its kind; inputs stay in host memory.
    std::optional<opforge::DefaultDevice> on;
    if (v.kind != opforge::DeviceKind::cpu) on.emplace(opforge::Device{v.kind, 0});
    out = f();
  } catch (const std::exception& e) {
    ADD_FAILURE() << op << " at " << g.dtype_key << " with variant " << v.name
                  << " forced threw: " << e.what();
    return out;
  }
  EXPECT_GT(calls_of(op, g.dtype_key, v.name), before)
      << "dispatch_stats() shows no call of variant " << v.name << " of " << op << " at "
      << g.dtype_key;
  return out;
}

const int64_t* mins_of(const VariantInfo& v) { return v.kernel->min_extents; }
int64_t at_least(int64_t minimum, int64_t size) { return std::max(minimum, size); }

// A tensor shape whose 6 elementwise call extents (extent 0 innermost = the last tensor dim) meet
// the minimum; the innermost extent is at least `inner`.
Shape elementwise_shape(const int64_t* mins, int64_t inner) {
  int last = 0;
  for (int d = 1; d < opforge::kMaxCallExtents; d++)
    if (mins[d] > 1) last = d;
  Shape s;
  for (int d = last; d >= 0; d--)
    s.push_back(d == 0 ? at_least(mins[0], inner) : at_least(mins[d], 1));
  return s;
}

std::string what(const KernelGroup& g, const VariantInfo& v) {
  std::ostringstream os;
  os << g.op->name << " at " << g.dtype_key << ", variant " << v.name << " (target "
     << v.kernel->target << ", minimum extents";
  for (int d = 0; d < opforge::kMaxCallExtents; d++) os << " " << v.kernel->min_extents[d];
  os << ")";
  return os.str();
}

using Handler = std::function<void(const KernelGroup&, const VariantInfo&)>;

// The layouts every variant is checked on: dense, and views whose strides the kernel sees as they
// are (a transpose, every other element, a stride-0 broadcast), as an op's callers pass them.
enum class Layout { dense, views };
const char* layout_name(Layout l) { return l == Layout::dense ? "dense inputs" : "strided views"; }

// A random tensor of `shape` that, for Layout::views, is a transpose of dims a and b of another.
Tensor random_as(Layout l, Shape shape, DType dt, Data data, const std::string& label, int a,
                 int b) {
  if (l == Layout::dense) return random(shape, dt, data, label);
  a = a < 0 ? int(shape.size()) + a : a;
  b = b < 0 ? int(shape.size()) + b : b;
  std::swap(shape[size_t(a)], shape[size_t(b)]);
  Tensor t = random(shape, dt, data, label + "/transposed").transpose(a, b);
  EXPECT_FALSE(t.is_contiguous());
  return t;
}

// A random tensor of `shape` that, for Layout::views, takes every other element of its last dim.
Tensor random_every_other(Layout l, Shape shape, DType dt, Data data, const std::string& label) {
  if (l == Layout::dense) return random(shape, dt, data, label);
  Shape base = shape;
  base.back() *= 2;
  int last = int(shape.size()) - 1;
  return random(base, dt, data, label + "/strided").slice(last, 0, base.back(), 2);
}

// ---- elementwise ----

void check_elementwise(const EwSpec& s, const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  EXPECT_EQ(g.out_dtype, s.out_dtype(dt)) << "registry output dtype of " << s.name;
  Shape shape = elementwise_shape(mins_of(v), 37);
  auto in = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), shape), "variant/" + v.name);
  Expected want = ew_expected(s, dt, in);
  Tensor got = run_forced(g, v, [&] { return s.call(in); });
  expect_close(got, want, s.out_dtype(dt), s.tol(dt));

  // The same variant on views the kernel sees with other strides: the first input transposed (a
  // non-unit innermost stride), the last broadcast along the rows (stride 0). 70 x 70 reaches the
  // hand schedule's tiled branch; a variant with a large minimum gets a few long rows.
  const int64_t* m = mins_of(v);
  int64_t inner = at_least(m[0], 70), rows = at_least(m[1], inner > 70 ? 3 : 70);
  std::string label = "variant-views/" + v.name;
  std::vector<Tensor> views =
      ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), {rows, inner}), label);
  views[0] = random({inner, rows}, s.input_dtype(0, dt), s.data[0], label + "/t").transpose(0, 1);
  if (s.arity >= 2)
    views.back() = random({inner}, s.input_dtype(s.arity - 1, dt), s.data.back(), label + "/b");
  Expected want_views = ew_expected(s, dt, views);
  Tensor got_views = run_forced(g, v, [&] { return s.call(views); });
  expect_close(got_views, want_views, s.out_dtype(dt), s.tol(dt));
}

// A backward kernel (`<op>_backward`) through elementwise_backward: every input's gradient against
// central finite differences of the op's float64 reference, on dense inputs and on views (the
// first input transposed, the last broadcast along the rows, so its gradient is summed).
void check_backward(const EwSpec& s, const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  int64_t inner = at_least(m[0], 70), rows = at_least(m[1], inner > 70 ? 3 : 70);
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    std::string label = std::string("backward/") + layout_name(l) + "/" + v.name;
    Shape shape = l == Layout::dense ? elementwise_shape(m, 37) : Shape{rows, inner};
    std::vector<Tensor> in = ew_inputs(s, dt, std::vector<Shape>(size_t(s.arity), shape), label);
    if (l == Layout::views) {
      in[0] = random({inner, rows}, s.input_dtype(0, dt), s.data[0], label + "/t").transpose(0, 1);
      if (s.arity >= 2)
        in.back() = random({inner}, s.input_dtype(s.arity - 1, dt), s.data.back(), label + "/b");
    }
    Tensor grad = random(shape, dt, Data::Normal, label + "/grad");
    std::vector<Expected> want = fd_gradients(s, in, grad);
    std::vector<Tensor> got;
    run_forced(g, v, [&] {
      got = opforge::elementwise_backward(s.name, in, grad, s.attr_values(dt));
      return got.empty() ? Tensor() : got[0];
    });
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++) {
      SCOPED_TRACE("gradient of input " + std::to_string(i));
      expect_close(got[i], want[i], dt, gradient_tol(s, dt));
    }
  }
}

void check_cast(const KernelGroup& g, const VariantInfo& v) {
  Shape shape = elementwise_shape(mins_of(v), 37);
  Tensor x = random(shape, g.in_dtype, Data::Quantized, "variant/cast/" + g.dtype_key + v.name);
  Expected want = broadcast_eval(
      {x}, [&](const std::vector<double>& a) { return cast_value(a[0], g.out_dtype); });
  Tensor got = run_forced(g, v, [&] { return opforge::cast(x, g.out_dtype); });
  expect_close(got, want, g.out_dtype);
}

// sincos: one kernel, two outputs; both are compared.
void check_sincos(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  Tensor x = random(elementwise_shape(mins_of(v), 37), dt, Data::Normal,
                    "variant/sincos/" + g.dtype_key + v.name);
  Expected sin = broadcast_eval({x}, [](const std::vector<double>& a) { return std::sin(a[0]); });
  Expected cos = broadcast_eval({x}, [](const std::vector<double>& a) { return std::cos(a[0]); });
  Tensor got_cos;
  Tensor got_sin = run_forced(g, v, [&] {
    auto [s, c] = opforge::sincos(x);
    got_cos = c;
    return s;
  });
  ASSERT_TRUE(got_cos.defined());
  expect_close(got_sin, sin, dt, transcendental_tol(dt));
  expect_close(got_cos, cos, dt, transcendental_tol(dt));
}

// axpy_: y += alpha * x written in place (an inout buffer), x broadcast along all but the
// innermost dim. The result must be y itself, and every element of y updated.
void check_axpy(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  Shape shape = elementwise_shape(mins_of(v), 37);
  std::string label = "variant/axpy/" + g.dtype_key + v.name;
  Tensor y = random(shape, dt, Data::Normal, label + "/y");
  Tensor x = random({shape.back()}, dt, Data::Normal, label + "/x");
  Expected want =
      broadcast_eval({y, x}, [](const std::vector<double>& a) { return a[0] + 0.75 * a[1]; });
  Tensor got = run_forced(g, v, [&] { return opforge::axpy_(y, 0.75, x); });
  EXPECT_EQ(got.storage(), y.storage()) << "axpy_ must return y, written in place";
  expect_close(y, want, dt, tol_for(dt));
}

// The optimiser steps: a parameter and its state written in place by one kernel, dense and as
// strided views (which the runtime updates through dense copies), against PyTorch's rules in
// float64. Adam's gradients are spread out so that its moments are not all alike. Besides the
// small shape, a parameter of 100 003 elements: the size of a layer's weights, past the CPU
// schedules' 8192-element chunks (and the size at which the GPU schedule's staged reads once
// asked for a device buffer too large to allocate).
enum class StepKind { sgd, momentum, nesterov, adam, adamw };
Handler step_handler(std::vector<StepKind> kinds) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    const double lr = 0.1, mom = 0.9, damp = 0.25, wd = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8;
    for (const Shape& shape : {elementwise_shape(mins_of(v), 37), Shape{100003}})
      for (StepKind kind : kinds)
        for (Layout l : {Layout::dense, Layout::views})
          for (bool first : {true, false}) {
            SCOPED_TRACE(std::string(layout_name(l)) + ", kind " + std::to_string(int(kind)) +
                         (first ? ", first step" : ", later step") + ", " +
                         std::to_string(shape[0]) + " elements in the first dim");
            std::string label = "variant/step/" + g.dtype_key + v.name + std::to_string(int(kind));
            Tensor p = random_every_other(l, shape, dt, Data::Normal, label + "/p");
            Tensor grad = random_every_other(l, shape, dt, Data::Normal, label + "/g");
            Tensor s1 = random_every_other(l, shape, dt, Data::Normal, label + "/s1");
            Tensor s2 = opforge::abs(random_every_other(l, shape, dt, Data::Normal, label + "/s2"));
            std::vector<double> pv = p.to_double_vector(), gv = grad.to_double_vector(),
                                s1v = s1.to_double_vector(), s2v = s2.to_double_vector();
            const int64_t step = first ? 1 : 5;
            for (size_t i = 0; i < pv.size(); i++) {
              double& P = pv[i];
              double G = gv[i];
              if (kind == StepKind::sgd) {
                P -= lr * (G + wd * P);
              } else if (kind == StepKind::momentum || kind == StepKind::nesterov) {
                double d = G + wd * P, dampening = kind == StepKind::nesterov ? 0 : damp;
                s1v[i] = first ? d : mom * s1v[i] + (1 - dampening) * d;
                P -= lr * (kind == StepKind::nesterov ? d + mom * s1v[i] : s1v[i]);
              } else {
                bool decoupled = kind == StepKind::adamw;
                if (decoupled)
                  P *= 1 - lr * wd;
                else
                  G += wd * P;
                s1v[i] = b1 * s1v[i] + (1 - b1) * G;
                s2v[i] = b2 * s2v[i] + (1 - b2) * G * G;
                double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
                P -= lr / bc1 * s1v[i] / (std::sqrt(s2v[i]) / std::sqrt(bc2) + eps);
              }
            }
            run_forced(g, v, [&] {
              switch (kind) {
                case StepKind::sgd:
                  opforge::sgd_step_(p, grad, lr, wd);
                  break;
                case StepKind::momentum:
                case StepKind::nesterov: {
                  bool nesterov = kind == StepKind::nesterov;
                  opforge::sgd_momentum_step_(p, grad, s1, lr, mom, nesterov ? 0 : damp, wd,
                                              nesterov, first);
                  break;
                }
                default:
                  opforge::adam_step_(p, grad, s1, s2, lr, b1, b2, eps, wd, kind == StepKind::adamw,
                                      step);
              }
              return p;
            });
            Tol tol = accum_tol(dt, 16);
            expect_close(p, Expected{pv, shape}, dt, tol);
            if (kind != StepKind::sgd) expect_close(s1, Expected{s1v, shape}, dt, tol);
            if (kind == StepKind::adam || kind == StepKind::adamw)
              expect_close(s2, Expected{s2v, shape}, dt, tol);
          }
  };
}

// ---- reduction: call extents (inner, reduced, outer) ----

struct RedShape {
  int64_t inner, reduced, outer;
};
RedShape reduction_shape(const VariantInfo& v) {
  const int64_t* m = mins_of(v);
  return {at_least(m[0], 3), at_least(m[1], 17), at_least(m[2], 5)};
}

Handler reduce_handler(Data data, ReduceFn fn, std::function<Tensor(const Tensor&)> call,
                       std::function<DType(DType)> out, bool transcendental = false) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    EXPECT_EQ(g.out_dtype, out(dt)) << "registry output dtype of " << g.op->name;
    RedShape r = reduction_shape(v);
    for (Layout l : {Layout::dense, Layout::views}) {
      SCOPED_TRACE(layout_name(l));
      Tensor x = random_as(l, {r.outer, r.reduced, r.inner}, dt, data,
                           "variant/" + g.op->name + v.name, 1, 2);
      Expected want = reduce(dense(x), {1}, false, fn);
      Tensor got = run_forced(g, v, [&] { return call(x); });
      Tol tol = accum_tol(out(dt), r.reduced);
      if (transcendental) tol = loosest(tol, transcendental_tol(dt));
      expect_close(got, want, out(dt), tol);
    }
  };
}

Handler softmax_handler(bool log) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    RedShape r = reduction_shape(v);
    for (Layout l : {Layout::dense, Layout::views}) {
      SCOPED_TRACE(layout_name(l));
      Tensor x = random_as(l, {r.outer, r.reduced, r.inner}, dt, Data::Normal,
                           "variant/softmax" + v.name, 0, 1);
      Expected want = softmax(dense(x), 1, log);
      Tensor got = run_forced(
          g, v, [&] { return log ? opforge::log_softmax(x, 1) : opforge::softmax(x, 1); });
      expect_close(got, want, dt, loosest(accum_tol(dt, r.reduced), transcendental_tol(dt)));
    }
  };
}

// softmax_backward, log_softmax_backward: x's gradient through autograd (the forward op's variant
// is the placement's choice), for a random gradient of the result.
Handler softmax_backward_handler(bool log) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    RedShape r = reduction_shape(v);
    for (Layout l : {Layout::dense, Layout::views}) {
      SCOPED_TRACE(layout_name(l));
      Shape s = {r.outer, r.reduced, r.inner};
      Tensor x = random_as(l, s, dt, Data::Normal, "variant/softmax_backward x" + v.name, 0, 1);
      Tensor gy = random_as(l, s, dt, Data::Normal, "variant/softmax_backward g" + v.name, 1, 2);
      Expected want = softmax_grad(dense(x), dense(gy), 1, log);
      Tensor leaf = x.detach().requires_grad_();
      Tensor got = run_forced(g, v, [&] {
        Tensor y = log ? opforge::log_softmax(leaf, 1) : opforge::softmax(leaf, 1);
        y.backward(gy);
        return leaf.grad();
      });
      expect_close(got, want, dt, loosest(accum_tol(dt, r.reduced), transcendental_tol(dt)));
    }
  };
}

// max_backward, min_backward, logsumexp_backward, var_backward: x's gradient through autograd
// (the forward op's variant is the placement's choice) for a random gradient of the result,
// against float64 formulas; max's and min's also on small integers, whose ties share it.
Handler reduction_backward_handler(const std::string& op) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    RedShape r = reduction_shape(v);
    bool extremum = op == "max" || op == "min";
    const double ddof = 1;
    std::vector<Data> datas = {op == "prod" ? Data::NearOne : Data::Normal};
    if (extremum) datas.push_back(Data::SmallInt);
    for (Data data : datas)
      for (Layout l : {Layout::dense, Layout::views}) {
        SCOPED_TRACE(std::string(layout_name(l)) + (data == Data::SmallInt ? ", ties" : ""));
        Shape s = {r.outer, r.reduced, r.inner};
        Tensor x = random_as(l, s, dt, data, "variant/" + op + "_bwd x" + v.name, 0, 1);
        // prod: rows with one zero and with two (the product of the others, PyTorch's rule).
        if (op == "prod") {
          std::vector<double> keep(size_t(x.numel()), 1.0);
          for (int64_t i = 0; i < r.inner; i++) {
            keep[size_t((0 * r.reduced + 1) * r.inner + i)] = 0;
            if (r.outer > 1) {
              keep[size_t((1 * r.reduced + 0) * r.inner + i)] = 0;
              keep[size_t((1 * r.reduced + r.reduced - 1) * r.inner + i)] = 0;
            }
          }
          x = opforge::mul(x, Tensor::from_vector(keep, s).to(dt));
          if (l == Layout::views) x = x.transpose(0, 1).contiguous().transpose(0, 1);
        }
        Tensor gy = random({r.outer, r.inner}, dt, Data::Normal, "variant/" + op + "_bwd g");
        std::vector<double> xv = x.to_double_vector(), gv = gy.to_double_vector(), want(xv.size());
        for (int64_t o = 0; o < r.outer; o++)
          for (int64_t i = 0; i < r.inner; i++) {
            auto at = [&](int64_t k) { return size_t((o * r.reduced + k) * r.inner + i); };
            double gr = gv[size_t(o * r.inner + i)], m = xv[at(0)], mu = 0, ties = 0, lse = 0;
            for (int64_t k = 0; k < r.reduced; k++) {
              m = op == "min" ? std::min(m, xv[at(k)]) : std::max(m, xv[at(k)]);
              mu += xv[at(k)] / double(r.reduced);
            }
            for (int64_t k = 0; k < r.reduced; k++) {
              ties += xv[at(k)] == m;
              lse += std::exp(xv[at(k)] - m);
            }
            lse = m + std::log(lse);
            for (int64_t k = 0; k < r.reduced; k++) {
              double others = 1;
              for (int64_t j = 0; j < r.reduced; j++)
                if (j != k) others *= xv[at(j)];
              want[at(k)] = extremum       ? (xv[at(k)] == m ? gr / ties : 0)
                            : op == "var"  ? gr * 2 * (xv[at(k)] - mu) / (double(r.reduced) - ddof)
                            : op == "prod" ? gr * others
                                           : gr * std::exp(xv[at(k)] - lse);
            }
          }
        Tensor leaf = x.detach().requires_grad_();
        Tensor got = run_forced(g, v, [&] {
          Tensor y = op == "max"    ? opforge::max(leaf, {1})
                     : op == "min"  ? opforge::min(leaf, {1})
                     : op == "var"  ? opforge::var(leaf, {1}, false, ddof)
                     : op == "prod" ? opforge::prod(leaf, {1})
                                    : opforge::logsumexp(leaf, {1});
          y.backward(gy);
          return leaf.grad();
        });
        expect_close(got, Expected{want, s}, dt,
                     loosest(accum_tol(dt, r.reduced), transcendental_tol(dt)));
      }
  };
}

// cross_entropy (its forward) and cross_entropy_backward (through autograd): rows of scores against
// random target distributions over the reduced extent as classes.
Handler cross_entropy_handler(bool backward) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    const int64_t* m = mins_of(v);
    ASSERT_LE(m[0], 1) << what(g, v) << ": cross_entropy's calls have an inner extent of 1";
    int64_t C = at_least(m[1], 11), N = at_least(m[2], 5);
    for (Layout l : {Layout::dense, Layout::views}) {
      SCOPED_TRACE(layout_name(l));
      Tensor x = random_as(l, {N, C}, dt, Data::Normal, "variant/cross_entropy x" + v.name, 0, 1);
      Tensor p = opforge::softmax(random({N, C}, dt, Data::Normal, "variant/cross_entropy p"), 1);
      Tensor gy = random({N}, dt, Data::Normal, "variant/cross_entropy g" + v.name);
      std::vector<double> gv = gy.to_double_vector();
      Expected want = cross_entropy(dense(x), dense(p), backward ? &gv : nullptr);
      Tensor leaf = x.detach().requires_grad_(backward);
      Tensor got = run_forced(g, v, [&] {
        Tensor loss = opforge::cross_entropy(leaf, p);
        if (!backward) return loss;
        loss.backward(gy);
        return leaf.grad();
      });
      expect_close(got, want, dt, loosest(accum_tol(dt, C), transcendental_tol(dt)));
    }
  };
}

// layer_norm_backward and layer_norm_backward_reduce: x's, the weight's and the bias's gradients
// through autograd, against the float64 formulas rstd (gw - mean(gw) - xhat mean(gw xhat)),
// gw = g weight; sum over the rows of g xhat; sum of g. layer_norm_backward's view is (D, rows, 1),
// layer_norm_backward_reduce's (1, D, rows).
void check_layer_norm_backward(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  const bool rows_view = g.op->name == "layer_norm_backward";
  ASSERT_LE(m[rows_view ? 2 : 0], 1) << what(g, v) << ": layer_norm's views have no batch";
  // 19 rows: the per-channel sums' chunks of 8 rows, two whole and a tail.
  int64_t reduced = at_least(m[rows_view ? 0 : 1], 17), outer = at_least(m[rows_view ? 1 : 2], 19);
  const double eps = 1e-5;
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    Tensor x = random_as(l, {outer, reduced}, dt, Data::Normal, "variant/ln_bwd x" + v.name, 0, 1);
    Tensor gy = random_as(l, {outer, reduced}, dt, Data::Normal, "variant/ln_bwd g" + v.name, 0, 1);
    Tensor w = random({reduced}, dt, Data::Normal, "variant/ln_bwd w" + v.name);
    Tensor b = random({reduced}, dt, Data::Normal, "variant/ln_bwd b" + v.name);
    std::vector<double> xv = x.to_double_vector(), gv = gy.to_double_vector(),
                        wv = w.to_double_vector(), want(xv.size());
    std::vector<double> dw(static_cast<size_t>(reduced)), db(static_cast<size_t>(reduced));
    for (int64_t o = 0; o < outer; o++) {
      auto at = [&](int64_t k) { return size_t(o * reduced + k); };
      double mu = 0, var = 0, mgw = 0, mgwx = 0;
      for (int64_t k = 0; k < reduced; k++) mu += xv[at(k)] / double(reduced);
      for (int64_t k = 0; k < reduced; k++)
        var += (xv[at(k)] - mu) * (xv[at(k)] - mu) / double(reduced);
      double rstd = 1 / std::sqrt(var + eps);
      for (int64_t k = 0; k < reduced; k++) {
        double gw = gv[at(k)] * wv[size_t(k)];
        mgw += gw / double(reduced);
        mgwx += gw * (xv[at(k)] - mu) * rstd / double(reduced);
      }
      for (int64_t k = 0; k < reduced; k++) {
        want[at(k)] = rstd * (gv[at(k)] * wv[size_t(k)] - mgw - (xv[at(k)] - mu) * rstd * mgwx);
        dw[size_t(k)] += gv[at(k)] * (xv[at(k)] - mu) * rstd;
        db[size_t(k)] += gv[at(k)];
      }
    }
    Tensor leaf = x.detach().requires_grad_(), wl = w.detach().requires_grad_(),
           bl = b.detach().requires_grad_();
    Tensor got = run_forced(g, v, [&] {
      opforge::layer_norm(leaf, {reduced}, wl, bl, eps).backward(gy);
      return leaf.grad();
    });
    Tol tol = loosest(accum_tol(dt, std::max(reduced, outer)), transcendental_tol(dt));
    expect_close(got, Expected{want, {outer, reduced}}, dt, tol);
    expect_close(wl.grad(), Expected{dw, {reduced}}, dt, tol);
    expect_close(bl.grad(), Expected{db, {reduced}}, dt, tol);
  }
}

void check_layer_norm(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  // The view (D, rows, 1): layer_norm normalises trailing dims, so nothing lies outside the rows.
  ASSERT_LE(m[2], 1) << what(g, v) << ": layer_norm's view has no batch";
  int64_t reduced = at_least(m[0], 17), outer = at_least(m[1], 5);
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    Tensor x =
        random_as(l, {outer, reduced}, dt, Data::Normal, "variant/layer_norm" + v.name, 0, 1);
    Tensor w = random_every_other(l, {reduced}, dt, Data::Normal, "variant/layer_norm w" + v.name);
    Tensor b = random({reduced}, dt, Data::Normal, "variant/layer_norm b" + v.name);
    Expected want = layer_norm(dense(x), 1, w.to_double_vector(), b.to_double_vector(), 1e-5);
    Tensor got = run_forced(g, v, [&] { return opforge::layer_norm(x, {reduced}, w, b); });
    expect_close(got, want, dt, loosest(accum_tol(dt, reduced), transcendental_tol(dt)));
  }
}

// The three batch_norm kernels, whichever of them is forced, through opforge::batch_norm forward
// and backward in training (the batch's statistics, the running ones updated) and in evaluation
// (the running statistics), against float64 formulas: per channel c over the n values of the
// other dims, xhat = (x - mean) rstd, y = xhat w + b; dx = w rstd (g - sum(g) / n -
// xhat sum(g xhat) / n) in training, w rstd g in evaluation; dw = sum(g xhat), db = sum(g).
// An (N, C, H, W) input whose planes take a whole number of vector lanes and a tail, and an
// (N, C) one (one value per channel and image) whose channels take at least a vector and a tail
// and whose 19 rows make chunks of 8, two whole and a tail.
void check_batch_norm(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const double eps = 1e-5, momentum = 0.1;
  // The minimum extents: (inner, channels, batch) for all four kernels.
  const int64_t* m = mins_of(v);
  const int64_t C = at_least(m[1], 19), W = at_least((m[0] + 4) / 5, 7);
  std::vector<Shape> shapes = {{at_least(m[2], 5), C, 5, W}};
  if (m[0] <= 1) shapes.push_back({at_least(m[2], 19), C});
  for (const Shape& shape : shapes)
    for (bool training : {true, false}) {
      // Training runs batch_norm_train (the batch's statistics and the result in one kernel),
      // evaluation batch_norm (the running statistics); batch_norm_backward runs in both.
      if (g.op->name == (training ? "batch_norm" : "batch_norm_train")) continue;
      SCOPED_TRACE(shape_str(shape) + (training ? " training" : " evaluation"));
      const int64_t N = shape[0], inner = shape.size() == 4 ? shape[2] * shape[3] : 1;
      const double n = double(N * inner);
      std::string label = "variant/batch_norm " + shape_str(shape) + v.name;
      Tensor x = random(shape, dt, Data::Normal, label + " x");
      if (shape.size() == 4) x = x.transpose(2, 3).contiguous().transpose(2, 3);  // strides kept
      Tensor gy = random(shape, dt, Data::Normal, label + " g");
      Tensor w = random({C}, dt, Data::Normal, label + " w");
      Tensor b = random({C}, dt, Data::Normal, label + " b");
      Tensor rm = random({C}, dt, Data::Normal, label + " rm");
      Tensor rv = opforge::add(opforge::abs(random({C}, dt, Data::Normal, label + " rv")), 0.5);
      std::vector<double> xv = x.to_double_vector(), gv = gy.to_double_vector(),
                          wv = w.to_double_vector(), bv = b.to_double_vector(),
                          rmv = rm.to_double_vector(), rvv = rv.to_double_vector();
      const size_t nc = static_cast<size_t>(C);
      std::vector<double> y(xv.size()), dx(xv.size()), dw(nc), db(nc), rm_want(nc), rv_want(nc);
      auto at = [&](int64_t o, int64_t c, int64_t i) { return size_t((o * C + c) * inner + i); };
      for (int64_t c = 0; c < C; c++) {
        double mu = 0, var = 0;
        for (int64_t o = 0; o < N; o++)
          for (int64_t i = 0; i < inner; i++) mu += xv[at(o, c, i)] / n;
        for (int64_t o = 0; o < N; o++)
          for (int64_t i = 0; i < inner; i++)
            var += (xv[at(o, c, i)] - mu) * (xv[at(o, c, i)] - mu) / n;
        rm_want[size_t(c)] =
            training ? (1 - momentum) * rmv[size_t(c)] + momentum * mu : rmv[size_t(c)];
        rv_want[size_t(c)] = training
                                 ? (1 - momentum) * rvv[size_t(c)] + momentum * var * n / (n - 1)
                                 : rvv[size_t(c)];
        if (!training) mu = rmv[size_t(c)], var = rvv[size_t(c)];
        double rstd = 1 / std::sqrt(var + eps), sg = 0, sgx = 0;
        for (int64_t o = 0; o < N; o++)
          for (int64_t i = 0; i < inner; i++) {
            size_t k = at(o, c, i);
            double xhat = (xv[k] - mu) * rstd;
            y[k] = xhat * wv[size_t(c)] + bv[size_t(c)];
            sg += gv[k];
            sgx += gv[k] * xhat;
          }
        for (int64_t o = 0; o < N; o++)
          for (int64_t i = 0; i < inner; i++) {
            size_t k = at(o, c, i);
            double xhat = (xv[k] - mu) * rstd;
            dx[k] = wv[size_t(c)] * rstd * (training ? gv[k] - sg / n - xhat * sgx / n : gv[k]);
          }
        dw[size_t(c)] = sgx;
        db[size_t(c)] = sg;
      }
      Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(),
             bl = b.detach().requires_grad_();
      Tensor out;
      Tensor got = run_forced(g, v, [&] {
        out = opforge::batch_norm(xl, rm, rv, wl, bl, training, momentum, eps);
        out.backward(gy);
        return xl.grad();
      });
      Tol tol = loosest(accum_tol(dt, int64_t(n)), transcendental_tol(dt));
      expect_close(out.detach(), Expected{y, shape}, dt, tol);
      expect_close(got, Expected{dx, shape}, dt, tol);
      expect_close(wl.grad(), Expected{dw, {C}}, dt, tol);
      expect_close(bl.grad(), Expected{db, {C}}, dt, tol);
      expect_close(rm, Expected{rm_want, {C}}, dt, tol);
      expect_close(rv, Expected{rv_want, {C}}, dt, tol);
    }
}

// ---- contraction: call extents (N, M, K, batch) ----

// Compares every element of the result with reference(0, M), rows [0, M) of its last-but-one dim.
void check_rows(const Tensor& got, int64_t M, int64_t K, DType dt,
                const std::function<Expected(int64_t r0, int64_t r1)>& reference) {
  ASSERT_TRUE(got.defined());
  ASSERT_GE(got.dim(), 2);
  expect_close(got, reference(0, M), dt, accum_tol(dt, K));
}

void check_matmul(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  int64_t N = at_least(m[0], 7), M = at_least(m[1], 9), K = at_least(m[2], 5), B = m[3];
  Shape as = {M, K}, bs = {K, N};
  if (B > 1) {
    as.insert(as.begin(), B);
    bs.insert(bs.begin(), B);
  }
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    Tensor a = random_as(l, as, dt, Data::Normal, "variant/matmul a" + v.name, -2, -1);
    Tensor b = random_every_other(l, bs, dt, Data::Normal, "variant/matmul b" + v.name);
    if (l == Layout::views && B > 1)  // one matrix for every batch: a stride-0 batch dim
      b = random({K, N}, dt, Data::Normal, "variant/matmul b1" + v.name).expand(bs);
    Tensor got = run_forced(g, v, [&] { return opforge::matmul(a, b); });
    Dense bd = dense(b);
    check_rows(got, M, K, dt, [&](int64_t r0, int64_t r1) {
      return matmul(dense(a.slice(a.dim() - 2, r0, r1)), bd);
    });
  }
}

void check_gemm(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  ASSERT_LE(m[3], 1) << what(g, v) << ": gemm is 2-D and cannot reach a batch extent above 1";
  int64_t N = at_least(m[0], 7), M = at_least(m[1], 9), K = at_least(m[2], 5);
  const double alpha = 0.5, beta = 2;
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    Tensor a = random_as(l, {M, K}, dt, Data::Normal, "variant/gemm a" + v.name, 0, 1);
    Tensor b = random_every_other(l, {K, N}, dt, Data::Normal, "variant/gemm b" + v.name);
    Tensor c = random_as(l, {M, N}, dt, Data::Normal, "variant/gemm c" + v.name, 0, 1);
    Tensor got = run_forced(g, v, [&] { return opforge::gemm(a, b, c, alpha, beta); });
    Dense bd = dense(b);
    check_rows(got, M, K, dt, [&](int64_t r0, int64_t r1) {
      return gemm(dense(a.slice(0, r0, r1)), bd, dense(c.slice(0, r0, r1)), alpha, beta, false,
                  false);
    });
  }
}

// linear reads its weight (N, K) as stored: K both a whole number of vectors and not, so the
// hand schedule's branch for each is run; with the ReLU.
void check_linear(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  ASSERT_LE(m[3], 1) << what(g, v) << ": linear's calls have a batch extent of 1";
  int64_t N = at_least(m[0], 7), M = at_least(m[1], 9);
  for (int64_t K : {at_least(m[2], 13), at_least(m[2], 32)})
    for (Layout l : {Layout::dense, Layout::views}) {
      SCOPED_TRACE(std::string(layout_name(l)) + " K " + std::to_string(K));
      Tensor x = random_as(l, {M, K}, dt, Data::Normal, "variant/linear x" + v.name, 0, 1);
      Tensor w = random_as(l, {N, K}, dt, Data::Normal, "variant/linear w" + v.name, 0, 1);
      Tensor b = random({N}, dt, Data::Normal, "variant/linear b" + v.name);
      Tensor got =
          run_forced(g, v, [&] { return opforge::linear(x, w, b, opforge::Activation::relu); });
      Dense wd = dense(w), bd = dense(b);
      check_rows(got, M, K, dt, [&](int64_t r0, int64_t r1) {
        return linear(dense(x.slice(0, r0, r1)), wd, bd, true);
      });
    }
}

// ---- window: output call extents (W, H, C, N) ----

void check_conv2d(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  int64_t N = at_least(m[3], 1), CI = 3;
  // Output widths under a vector, past one and past three (the hand schedule's tiles, each with a
  // tail), channels past a whole tile, 5 output rows (past its 4-row tile) and 3 (under it); 3x3
  // kernels with padding 1, at stride 1 (the output as large as the input) and at stride 2 with
  // dilation 2.
  ConvParams plain, strided;
  plain.pad_h = plain.pad_w = 1;
  strided = plain;
  strided.stride_w = strided.stride_h = 2;
  strided.dil_w = 2;
  // The hand schedule's minimum width is half a vector.
  int64_t half = std::max<int64_t>(m[0], 1), lanes = 2 * half;
  std::set<int64_t> heights = {at_least(m[1], 5), at_least(m[1], 3)};
  for (int64_t H : heights)
    for (int64_t W : {half + half / 2, lanes + 3, 3 * lanes + 5})
      for (const ConvParams& p : {plain, strided})
        for (Layout l : {Layout::dense, Layout::views}) {
          SCOPED_TRACE(std::string(layout_name(l)) + ", width " + std::to_string(W) + ", height " +
                       std::to_string(H) + ", stride " + std::to_string(p.stride_w));
          int64_t CO = at_least(m[2], 4) + 6, XW = (W - 1) * p.stride_w + 1 + 2 * p.dil_w - 2,
                  XH = (H - 1) * p.stride_h + 1;
          Tensor x =
              random_every_other(l, {N, CI, XH, XW}, dt, Data::Normal, "variant/conv x" + v.name);
          Tensor w =
              random_as(l, {CO, CI, 3, 3}, dt, Data::Normal, "variant/conv w" + v.name, 0, 1);
          Tensor b = random_every_other(l, {CO}, dt, Data::Normal, "variant/conv b" + v.name);
          Expected want = conv2d(dense(x), dense(w), b.to_double_vector(), p);
          Tensor got = run_forced(g, v, [&] { return opforge::conv2d(x, w, b, options_of(p)); });
          expect_close(got, want, dt, accum_tol(dt, CI * 9));
        }
}

// The pools, forward: max_pool2d (is_max), avg_pool2d, or max_pool2d_with_indices (indices),
// whose indices are compared exactly.
Handler pool_handler(bool is_max, bool indices = false) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    const int64_t* m = mins_of(v);
    int64_t W = at_least(m[0], 6), H = at_least(m[1], 5), C = at_least(m[2], 3),
            N = at_least(m[3], 1);
    // 3x3, stride 1, padding 1 (the output as large as the input), and the 2x2 pool of stride 2
    // that the hand schedule gives branches of its own, each at output rows of several widths:
    // the schedule's branches are a whole vector or more, half of one, less (18, 12, 6, 3 and 1
    // reach all three at 4, 8 and 16 lanes).
    struct Case {
      PoolParams p;
      int64_t w;
    };
    // (At least twice a variant's minimum extents: its output is half the input.)
    std::vector<Case> cases;
    for (int64_t w : {int64_t(1), int64_t(3), W, int64_t(11), int64_t(19)})
      cases.push_back({square_pool(3, 1, 1, false), std::max(w, m[0])});
    for (int64_t w : {37, 25, 13, 7, 3})
      cases.push_back({square_pool(2, 2, 0, false), std::max(w, 2 * m[0])});
    for (const Case& c : cases)
      for (Layout l : {Layout::dense, Layout::views}) {
        if (l == Layout::views && c.w == 1) continue;  // a strided view one element wide is dense
        SCOPED_TRACE(std::string(layout_name(l)) + ", kernel " + std::to_string(c.p.kernel_w) +
                     ", width " + std::to_string(c.w));
        opforge::Pool2dOptions o = options_of(c.p);
        int64_t h = c.p.stride_h == 2 ? std::max(H, 2 * m[1]) : H;
        Tensor x = random_as(l, {N, C, h, c.w}, dt, Data::Normal, "variant/pool" + v.name, 2, 3);
        Expected want = pool2d(dense(x), c.p, is_max);
        Tensor got_indices;
        Tensor got = run_forced(g, v, [&] {
          if (!indices) return is_max ? opforge::max_pool2d(x, o) : opforge::avg_pool2d(x, o);
          auto [values, at] = opforge::max_pool2d_with_indices(x, o);
          got_indices = at;
          return values;
        });
        expect_close(got, want, dt, accum_tol(dt, 9));
        if (!indices) continue;
        ASSERT_TRUE(got_indices.defined());
        EXPECT_EQ(got_indices.dtype(), DType::Int64);
        expect_close(got_indices, max_pool2d_indices(dense(x), c.p), DType::Int64, exact());
      }
  };
}

// The gradients of conv2d, at stride 1 (the kernels' specialised branch) and at stride 2 with
// dilation (the general one), through the public ops.
std::vector<ConvParams> conv_grad_cases() {
  ConvParams plain, strided;
  plain.pad_h = plain.pad_w = 1;
  strided.pad_h = 1;
  strided.pad_w = 2;
  strided.stride_h = strided.stride_w = 2;
  strided.dil_w = 2;
  return {plain, strided};
}
int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// The gradients' shapes beyond conv_grad_cases' strides: every tile of the hand schedules whole
// and with a tail (channels, images, kernel rows), few input channels (a first layer), groups.
struct ConvGradShape {
  int64_t kw, kh, c, n, groups;
};

void check_conv2d_backward_input(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  // Call extents: the input gradient's (W, H, C, N); C and CO per group.
  int64_t W = at_least(m[0], 7), H = at_least(m[1], 6), C = at_least(m[2], 4),
          N = at_least(m[3], 2);
  for (ConvGradShape s : {ConvGradShape{3, 3, C, N, 1}, ConvGradShape{3, 3, C + 3, N + 1, 1},
                          ConvGradShape{3, 3, C + 3, N, 2}})
    for (ConvParams k : conv_grad_cases())
      for (Layout l : {Layout::dense, Layout::views}) {
        k.groups = s.groups;
        SCOPED_TRACE(std::string(layout_name(l)) + ", stride " + std::to_string(k.stride_w) +
                     ", C " + std::to_string(s.c) + ", N " + std::to_string(s.n) + ", groups " +
                     std::to_string(s.groups));
        int64_t CO = 3 * s.groups;
        Shape gs = {s.n, CO, conv_out(H, s.kh, k.stride_h, k.pad_h, k.dil_h),
                    conv_out(W, s.kw, k.stride_w, k.pad_w, k.dil_w)};
        Tensor grad = random_every_other(l, gs, dt, Data::Normal, "variant/convbi g" + v.name);
        Tensor w = random_as(l, {CO, s.c, s.kh, s.kw}, dt, Data::Normal,
                             "variant/convbi w" + v.name, 0, 1);
        Shape xs = {s.n, s.c * s.groups, H, W};
        Expected want = conv2d_backward_input(dense(grad), dense(w), xs, k);
        Tensor got = run_forced(
            g, v, [&] { return opforge::conv2d_backward_input(grad, w, xs, options_of(k)); });
        expect_close(got, want, dt, accum_tol(dt, CO * s.kh * s.kw));
      }
}

void check_conv2d_backward_weight(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  // Call extents: the weight gradient's (KW, KH, C / groups, CO).
  int64_t KW = at_least(m[0], 3), KH = at_least(m[1], 2), C = at_least(m[2], 3),
          CO = at_least(m[3], 4), H = 7, W = 11;
  for (ConvGradShape s :
       {ConvGradShape{KW, KH, C, 2, 1},
        ConvGradShape{KW, at_least(m[1], 5), at_least(m[2], 2), 10, 1},
        ConvGradShape{at_least(m[0], 2), at_least(m[1], 3), at_least(m[2], 6), 9, 1},
        ConvGradShape{KW, KH, at_least(m[2], 4), 3, 2}})
    for (ConvParams k : conv_grad_cases())
      for (Layout l : {Layout::dense, Layout::views}) {
        k.groups = s.groups;
        SCOPED_TRACE(std::string(layout_name(l)) + ", stride " + std::to_string(k.stride_w) +
                     ", KH " + std::to_string(s.kh) + ", C " + std::to_string(s.c) + ", N " +
                     std::to_string(s.n) + ", groups " + std::to_string(s.groups));
        int64_t co = (CO + 5 + s.groups - 1) / s.groups * s.groups;  // past a whole tile
        Shape gs = {s.n, co, conv_out(H, s.kh, k.stride_h, k.pad_h, k.dil_h),
                    conv_out(W, s.kw, k.stride_w, k.pad_w, k.dil_w)};
        Tensor x = random_as(l, {s.n, s.c * s.groups, H, W}, dt, Data::Normal,
                             "variant/convbw x" + v.name, 0, 1);
        Tensor grad = random_every_other(l, gs, dt, Data::Normal, "variant/convbw g" + v.name);
        Shape ws = {co, s.c, s.kh, s.kw};
        Expected want = conv2d_backward_weight(dense(x), dense(grad), ws, k);
        Tensor got = run_forced(
            g, v, [&] { return opforge::conv2d_backward_weight(x, grad, ws, options_of(k)); });
        expect_close(got, want, dt, accum_tol(dt, s.n * gs[2] * gs[3]));
      }
}

// The pools' gradients: overlapping windows (3x3, stride 2, padding 1) and the tiling ones a CNN
// uses (2x2, stride 2).
Handler pool_backward_handler(bool is_max) {
  return [=](const KernelGroup& g, const VariantInfo& v) {
    DType dt = g.in_dtype;
    const int64_t* m = mins_of(v);
    int64_t W = at_least(m[0], 9), H = at_least(m[1], 6), C = at_least(m[2], 3),
            N = at_least(m[3], 2);
    // The 2x2 pool also at rows of 37, 12, 6, 3 and 2 (the output is as wide as the input; see
    // pool_handler).
    struct Case {
      int64_t k, w;
    };
    std::vector<Case> cases = {{3, W}};
    for (int64_t w : {37, 12, 6, 3, 2}) cases.push_back({2, std::max(w, m[0])});
    for (Case c : cases)
      for (Layout l : {Layout::dense, Layout::views}) {
        int64_t k = c.k;
        SCOPED_TRACE(std::string(layout_name(l)) + ", kernel " + std::to_string(k) + ", width " +
                     std::to_string(c.w));
        PoolParams p = square_pool(k, 2, k == 3 ? 1 : 0, false);
        opforge::Pool2dOptions o = options_of(p);
        Tensor x = random_as(l, {N, C, H, c.w}, dt, Data::Normal, "variant/poolb" + v.name, 2, 3);
        Shape gs = {N, C, (H + 2 * p.pad_h - k) / 2 + 1, (c.w + 2 * p.pad_w - k) / 2 + 1};
        Tensor grad = random_every_other(l, gs, dt, Data::Normal, "variant/poolb g" + v.name);
        Expected want = pool2d_backward(dense(x), dense(grad), p, is_max);
        Tensor got = run_forced(g, v, [&] {
          return is_max ? opforge::max_pool2d_backward(x, grad, o)
                        : opforge::avg_pool2d_backward(x, grad, o);
        });
        expect_close(got, want, dt, accum_tol(dt, 4));
      }
  };
}

// ---- movement ----

void check_copy(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  Shape shape = elementwise_shape(mins_of(v), 37);
  // a strided view of exactly that shape: every other element of the innermost dim
  Shape base_shape = shape;
  base_shape.back() *= 2;
  Tensor base = random(base_shape, dt, Data::Normal, "variant/copy" + v.name);
  Tensor view = base.slice(int(shape.size()) - 1, 0, base_shape.back(), 2);
  ASSERT_FALSE(view.is_contiguous());
  std::vector<double> want = view.to_double_vector();
  Tensor got = run_forced(g, v, [&] { return view.contiguous(); });
  EXPECT_TRUE(got.is_contiguous());
  expect_close(got, want, shape, dt, exact());
  // A broadcast source: one row repeated along every outer dim, and a new one (stride 0).
  Shape outer_shape = shape;
  outer_shape.insert(outer_shape.begin(), 3);
  Tensor row = random({shape.back()}, dt, Data::Normal, "variant/copy row" + v.name);
  Tensor expanded = row.expand(outer_shape);
  std::vector<double> want_b = expanded.to_double_vector();
  Tensor got_b = run_forced(g, v, [&] { return expanded.contiguous(); });
  expect_close(got_b, want_b, outer_shape, dt, exact());
}

// index_add with repeated and negative indices, into a dense input and into a broadcast one (as
// index_select's gradient adds into a stride-0 zero).
void check_index_add(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  int64_t inner = at_least(m[0], 5), n = at_least(m[1], 7), outer = at_least(m[2], 3), J = 13;
  std::vector<int64_t> idx(static_cast<size_t>(J));
  for (int64_t j = 0; j < J; j++) idx[size_t(j)] = (j * 5) % n - (j % 3 == 0 ? n : 0);
  Tensor index = Tensor::from_vector(idx, {J});
  Tensor src = random({outer, J, inner}, dt, Data::Unit, "variant/index_add s" + v.name);
  for (bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast input" : "dense input");
    Tensor x = broadcast
                   ? random({1, 1, inner}, dt, Data::Unit, "variant/index_add b" + v.name)
                         .expand({outer, n, inner})
                   : random({outer, n, inner}, dt, Data::Unit, "variant/index_add x" + v.name);
    Expected want = index_add(dense(x), 1, idx, dense(src), 1);
    Tensor got = run_forced(g, v, [&] { return opforge::index_add(x, 1, index, src); });
    expect_close(got, want, dt, opforge::is_floating(dt) ? accum_tol(dt, 4) : exact());
  }
}

void check_gather(const KernelGroup& g, const VariantInfo& v) {
  DType dt = g.in_dtype;
  const int64_t* m = mins_of(v);
  int64_t inner = at_least(m[0], 3), J = at_least(m[1], 11), n = 7;
  int64_t outer = at_least(m[2], inner * J > (int64_t(1) << 20) ? 1 : 2);
  for (Layout l : {Layout::dense, Layout::views}) {
    SCOPED_TRACE(layout_name(l));
    Tensor x = random_as(l, {outer, n, inner}, dt, Data::Normal, "variant/gather x" + v.name, 0, 2);
    std::vector<double> idx_values =
        random_values(J, DType::Int64, Data::Unit, seed_of("variant/gather i" + v.name));
    for (auto& i : idx_values) i = std::fmod(i, double(n));  // Unit ints are 0..9: fold into [0, n)
    Tensor index = make(idx_values, {J}, DType::Int64);
    Tensor got = run_forced(g, v, [&] { return opforge::index_select(x, 1, index); });
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.dtype(), dt);
    ASSERT_EQ(got.shape(), (Shape{outer, J, inner}));
    ASSERT_TRUE(got.is_contiguous());
    // a gather copies bytes: compare rows of `inner` elements with memcmp (the output can be large)
    size_t row = size_t(inner) * got.element_size();
    Tensor xc = x.contiguous();  // the bytes a view stands for, in order
    const char* src = static_cast<const char*>(xc.data());
    const char* dst = static_cast<const char*>(got.data());
    int64_t bad = 0;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < J; j++) {
        int64_t k = int64_t(idx_values[size_t(j)]);
        if (std::memcmp(dst + size_t(o * J + j) * row, src + size_t(o * n + k) * row, row) != 0) {
          if (bad < 5)
            ADD_FAILURE() << "row (outer " << o << ", index " << j << " -> " << k << ") differs";
          bad++;
        }
      }
    EXPECT_EQ(bad, 0) << "rows that differ, of " << outer * J;
  }
}

// ---- the table ----

const std::map<std::string, Handler>& handlers() {
  static const std::map<std::string, Handler> table = [] {
    std::map<std::string, Handler> t;
    for (const EwSpec& s : ew_specs()) {
      const EwSpec* sp = &s;
      t[s.name] = [sp](const KernelGroup& g, const VariantInfo& v) {
        check_elementwise(*sp, g, v);
      };
      if (s.differentiable())
        t[s.name + "_backward"] = [sp](const KernelGroup& g, const VariantInfo& v) {
          check_backward(*sp, g, v);
        };
    }
    t["cast"] = check_cast;
    t["sincos"] = check_sincos;
    t["axpy_"] = check_axpy;
    t["sgd_"] = step_handler({StepKind::sgd});
    t["sgd_momentum_"] = step_handler({StepKind::momentum, StepKind::nesterov});
    t["adam_"] = step_handler({StepKind::adam, StepKind::adamw});
    auto same = [](DType d) { return d; };
    auto widen = [](DType d) { return opforge::is_floating(d) ? d : DType::Int64; };
    auto i64 = [](DType) { return DType::Int64; };
    t["sum"] = reduce_handler(
        Data::Normal, fn::sum, [](const Tensor& x) { return opforge::sum(x, {1}); }, widen);
    t["mean"] = reduce_handler(
        Data::Normal, fn::mean, [](const Tensor& x) { return opforge::mean(x, {1}); }, same);
    t["prod"] = reduce_handler(
        Data::NearOne, fn::prod, [](const Tensor& x) { return opforge::prod(x, {1}); }, widen);
    t["max"] = reduce_handler(
        Data::Normal, fn::max, [](const Tensor& x) { return opforge::max(x, {1}); }, same);
    t["min"] = reduce_handler(
        Data::Normal, fn::min, [](const Tensor& x) { return opforge::min(x, {1}); }, same);
    t["argmax"] = reduce_handler(
        Data::Distinct, fn::argmax, [](const Tensor& x) { return opforge::argmax(x, 1); }, i64);
    t["argmin"] = reduce_handler(
        Data::Distinct, fn::argmin, [](const Tensor& x) { return opforge::argmin(x, 1); }, i64);
    t["logsumexp"] = reduce_handler(
        Data::Normal, fn::logsumexp, [](const Tensor& x) { return opforge::logsumexp(x, {1}); },
        same, true);
    t["var"] = reduce_handler(
        Data::Normal, [](const std::vector<double>& a) { return fn::var(a, 1); },
        [](const Tensor& x) { return opforge::var(x, {1}, false, 1); }, same);
    t["softmax"] = softmax_handler(false);
    t["log_softmax"] = softmax_handler(true);
    t["softmax_backward"] = softmax_backward_handler(false);
    t["log_softmax_backward"] = softmax_backward_handler(true);
    t["cross_entropy"] = cross_entropy_handler(false);
    t["cross_entropy_backward"] = cross_entropy_handler(true);
    t["layer_norm"] = check_layer_norm;
    t["layer_norm_backward"] = check_layer_norm_backward;
    t["layer_norm_backward_reduce"] = check_layer_norm_backward;
    for (const char* op : {"batch_norm_train", "batch_norm", "batch_norm_backward"})
      t[op] = check_batch_norm;
    for (const char* op : {"max", "min", "logsumexp", "var", "prod"})
      t[std::string(op) + "_backward"] = reduction_backward_handler(op);
    t["matmul"] = check_matmul;
    t["gemm"] = check_gemm;
    t["linear"] = check_linear;
    t["conv2d"] = check_conv2d;
    t["max_pool2d"] = pool_handler(true);
    t["max_pool2d_with_indices"] = pool_handler(true, true);
    t["avg_pool2d"] = pool_handler(false);
    t["conv2d_backward_input"] = check_conv2d_backward_input;
    t["conv2d_backward_weight"] = check_conv2d_backward_weight;
    t["max_pool2d_backward"] = pool_backward_handler(true);
    t["avg_pool2d_backward"] = pool_backward_handler(false);
    t["copy"] = check_copy;
    t["gather"] = check_gather;
    t["index_add"] = check_index_add;
    return t;
  }();
  return table;
}

// ---- what the DSL defines (dsl/opforge/ops/*.hpp), to check the registry against ----

std::map<std::string, std::set<std::string>> dsl_dtype_keys() {
  std::map<std::string, std::set<std::string>> m;
  auto keys = [](const std::vector<DType>& ts) {
    std::set<std::string> s;
    for (DType t : ts) s.insert(dname(t));
    return s;
  };
  for (const EwSpec& s : ew_specs()) {
    m[s.name] = keys(s.dtypes);
    if (s.differentiable()) m[s.name + "_backward"] = keys(kFloatTypes);
  }
  for (DType a : kAllTypes)
    for (DType b : kAllTypes)
      if (a != b) m["cast"].insert(dname(a) + "_to_" + dname(b));
  for (const char* op : {"sum", "prod", "max", "min", "argmax", "argmin"})
    m[op] = keys(kNumericTypes);
  for (const char* op : {"mean",
                         "logsumexp",
                         "var",
                         "softmax",
                         "log_softmax",
                         "softmax_backward",
                         "log_softmax_backward",
                         "cross_entropy",
                         "cross_entropy_backward",
                         "layer_norm",
                         "layer_norm_backward",
                         "layer_norm_backward_reduce",
                         "max_backward",
                         "min_backward",
                         "logsumexp_backward",
                         "var_backward",
                         "prod_backward",
                         "batch_norm_train",
                         "batch_norm",
                         "batch_norm_backward",
                         "matmul",
                         "gemm",
                         "linear",
                         "conv2d",
                         "max_pool2d",
                         "max_pool2d_with_indices",
                         "avg_pool2d",
                         "sincos",
                         "axpy_",
                         "sgd_",
                         "sgd_momentum_",
                         "adam_",
                         "conv2d_backward_input",
                         "conv2d_backward_weight",
                         "max_pool2d_backward",
                         "avg_pool2d_backward"})
    m[op] = keys(kFloatTypes);
  m["copy"] = keys(kAllTypes);
  m["gather"] = keys(kAllTypes);
  m["index_add"] = keys(kNumericTypes);
  return m;
}

TEST(Variants, EveryDslOpIsRegisteredWithItsDtypes) {
  for (const auto& [name, keys] : dsl_dtype_keys()) {
    SCOPED_TRACE(name);
    const OpInfo* op = opforge::find_op(name);
    ASSERT_NE(op, nullptr) << "the DSL defines " << name
                           << " but the registry has no kernels for it";
    auto got = op->dtype_keys();
    EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), keys);
    for (const auto& [key, g] : op->groups) {
      EXPECT_EQ(g.op, op);
      EXPECT_EQ(g.dtype_key, key);
      EXPECT_FALSE(g.variants.empty()) << key << " has no variants";
      for (const auto& v : g.variants) {
        ASSERT_NE(v.kernel, nullptr) << key << " " << v.name;
        EXPECT_EQ(std::string(v.kernel->op), name);
        EXPECT_EQ(std::string(v.kernel->dtype_key), key);
        EXPECT_EQ(std::string(v.kernel->variant), v.name);
        EXPECT_NE(v.kernel->argv, nullptr) << key << " " << v.name;
      }
    }
  }
}

TEST(Variants, EveryRegisteredOpHasAVariantTest) {
  auto ops = opforge::all_ops();
  ASSERT_FALSE(ops.empty()) << "no kernels are registered";
  int covered = 0;
  for (const OpInfo* op : ops) {
    if (is_test_op(op->name)) continue;
    EXPECT_TRUE(handlers().count(op->name))
        << "op '" << op->name << "' (family " << op->family
        << ") has no variant test: add it to the table in tests/test_variants.cpp";
    covered++;
  }
  EXPECT_GE(covered, int(dsl_dtype_keys().size()));
}

// ---- one test per (op, dtype, variant) ----

struct VariantParam {
  std::string op, dtype_key, variant;
  opforge::DeviceKind kind = opforge::DeviceKind::cpu;
  // "" for CPU variants, else the GPU API: GPU variants share names across APIs ("gpu", "li2018").
  std::string api() const {
    return kind == opforge::DeviceKind::cpu ? "" : opforge::Device{kind, 0}.str();
  }
};
void PrintTo(const VariantParam& p, std::ostream* os) {
  *os << p.op << "/" << p.dtype_key << "/" << p.variant << (p.api().empty() ? "" : "@") << p.api();
}

// CPU variants at every dtype. GPU variants at one dtype per op (float32 where the op has it):
// the OpenCL driver compiles each kernel on first use (PoCL: about 0.3 s, plus 1 s to start in
// each test process), and the GPU code paths differ by schedule, not by dtype.
std::vector<VariantParam> all_variant_params() {
  std::vector<VariantParam> out;
  for (const OpInfo* op : opforge::all_ops()) {
    if (is_test_op(op->name)) continue;
    std::string gpu_key = op->find_group("float32") ? "float32" : op->groups.begin()->first;
    for (const auto& [key, g] : op->groups)
      for (const auto& v : g.variants)
        if (v.kind == opforge::DeviceKind::cpu || key == gpu_key)
          out.push_back({op->name, key, v.name, v.kind});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<VariantParam>& i) {
  std::string s = i.param.op + "_" + i.param.dtype_key + "_" + i.param.variant;
  if (std::string api = i.param.api(); !api.empty()) s += "_" + api.substr(0, api.find(':'));
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class VariantTest : public ::testing::TestWithParam<VariantParam> {};

TEST_P(VariantTest, MatchesReference) {
  const VariantParam& p = GetParam();
  const OpInfo& op = opforge::op_info(p.op);
  const KernelGroup& g = op.group(p.dtype_key);
  auto it = std::find_if(g.variants.begin(), g.variants.end(), [&](const VariantInfo& v) {
    return v.name == p.variant && v.kind == p.kind;
  });
  ASSERT_NE(it, g.variants.end());
  ASSERT_NE(it->kernel, nullptr);
  if (!opforge::device_exists({it->kind, 0}))
    GTEST_SKIP() << "no " << it->kernel->target << " device on this machine";
  auto h = handlers().find(p.op);
  ASSERT_NE(h, handlers().end())
      << "op '" << p.op << "' (family " << op.family
      << ") has no variant test: add it to the table in tests/test_variants.cpp";
  SCOPED_TRACE(what(g, *it));
  h->second(g, *it);
}

INSTANTIATE_TEST_SUITE_P(All, VariantTest, ::testing::ValuesIn(all_variant_params()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VariantTest);

// The GPU variants at the dtypes MatchesReference leaves out (float64 has its own code paths: the
// GPU APIs' double math, opforge's own erf, expm1 and log1p), one test per family and API, so that
// ctest spreads them over its jobs (together they were 3 minutes of PoCL compiling on one core).
struct GpuFamily {
  opforge::DeviceKind kind;
  const char* family;
};

class GpuVariantsAtOtherDtypes : public ::testing::TestWithParam<GpuFamily> {};

TEST_P(GpuVariantsAtOtherDtypes, MatchReference) {
  opforge::Device d{GetParam().kind, 0};
  if (!opforge::device_exists(d)) GTEST_SKIP() << "no " << d.str() << " on this machine";
  int checked = 0;
  for (const OpInfo* op : opforge::all_ops()) {
    if (is_test_op(op->name) || op->family != GetParam().family) continue;
    std::string gpu_key = op->find_group("float32") ? "float32" : op->groups.begin()->first;
    for (const auto& [key, g] : op->groups) {
      if (key == gpu_key) continue;
      for (const auto& v : g.variants) {
        if (v.kind != d.kind || !v.kernel) continue;
        auto h = handlers().find(op->name);
        ASSERT_NE(h, handlers().end()) << op->name << " has no variant test";
        SCOPED_TRACE(what(g, v));
        h->second(g, v);
        checked++;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

std::vector<GpuFamily> gpu_families() {
  std::vector<GpuFamily> all;
  for (auto kind : {opforge::DeviceKind::opencl, opforge::DeviceKind::cuda})
    for (const char* f : {"elementwise", "reduction", "contraction", "window", "movement"})
      all.push_back({kind, f});
  return all;
}
std::string api_family_name(const ::testing::TestParamInfo<GpuFamily>& i) {
  // Ends in the API, as the variant tests' names do, so the runs that filter out *_opencl:*_cuda
  // (every op again on logical CPU devices) leave these out too.
  return std::string(i.param.family) + "_" +
         (i.param.kind == opforge::DeviceKind::cuda ? "cuda" : "opencl");
}
INSTANTIATE_TEST_SUITE_P(Api, GpuVariantsAtOtherDtypes, ::testing::ValuesIn(gpu_families()),
                         api_family_name);

}  // namespace
