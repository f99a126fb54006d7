// Turns a DSL op at one dtype into a Halide pipeline over its family's canonical view: the
// kernel's arguments (inputs, attributes, output), the Funcs a schedule works on, and the
// estimates an autoscheduler needs. Each family's canonical extents ("call extents") are what the
// runtime passes when it asks whether a variant may run a call.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "opforge/dsl/op.hpp"

namespace opforge::gen {
using namespace opforge::dsl;
using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::Var;

struct Pipeline {
  std::string op, dtype_key;
  Family family;
  DType in_dtype, out_dtype;
  int num_inputs = 0;
  std::string attrs;      // the op's attribute spec
  int variant_flags = 0;  // family-specific: ReductionKind, WindowKind, MovementKind
  std::vector<ImageParam> inputs;
  std::vector<Halide::Param<double>> float_attrs;
  std::vector<Halide::Param<int32_t>> int_attrs;
  std::vector<Halide::Argument> args;  // in ABI order: inputs, attributes
  Expr int_attr(const std::string& name) const {
    for (const auto& a : int_attrs)
      if (a.name() == name) return a;
    throw std::runtime_error("pipeline " + op + " has no integer attribute " + name);
  }
  Func out, acc;   // acc: the accumulation of contraction and window ops; out: Tuple-valued when
                   // the op has several outputs
  int inout = -1;  // >= 0: the input that the (one) output is written into, in place
  Func padded;     // window: the input with its zero border
  // reduction: the op's reductions over the reduced axis. Schedules place them explicitly: by
  // default Halide computes a reduction in the innermost loop of its consumer, so a normalize op
  // would recompute a row's max and sum for each element of the row, and var its mean for each
  // term of its sum.
  std::vector<Func> reductions;
  std::vector<Var> vars;  // out's pure vars, innermost first
  // Sets estimates for an autoscheduler at the given size; returns the call extents below which
  // the resulting schedule may be invalid.
  std::function<std::vector<int64_t>(int64_t size)> set_estimates;
};

inline DType dtype_of_halide(const Type& t) {
  if (t == Halide::UInt(8)) return DType::Bool;
  if (t == Halide::Int(32)) return DType::Int32;
  if (t == Halide::Int(64)) return DType::Int64;
  if (t == Halide::Float(32)) return DType::Float32;
  if (t == Halide::Float(64)) return DType::Float64;
  throw std::runtime_error("no opforge dtype for Halide type " + Halide::type_to_c_type(t, false));
}

// A kernel's buffers in declared order (kernel_abi.hpp): the inputs, one of which may be written in
// place (inout), then the outputs of `out` (several when it is Tuple-valued).
struct BufferDecl {
  std::string name;
  BufferRole role;
  DType dtype;
  int dims;
};
inline std::vector<BufferDecl> buffer_decls(const Pipeline& p) {
  std::vector<BufferDecl> b;
  for (size_t i = 0; i < p.inputs.size(); i++)
    b.push_back({p.inputs[i].name(), int(i) == p.inout ? BufferRole::inout : BufferRole::input,
                 dtype_of_halide(p.inputs[i].type()), p.inputs[i].dimensions()});
  if (p.inout >= 0) return b;
  auto types = p.out.output_types();
  for (size_t k = 0; k < types.size(); k++)
    b.push_back({types.size() == 1 ? std::string("out") : "out" + std::to_string(k),
                 BufferRole::output, dtype_of_halide(types[k]), p.out.dimensions()});
  return b;
}

namespace detail {
inline Attrs make_attrs(Pipeline& p, const char* spec, Type type) {
  Attrs a;
  for (const auto& s : parse_attr_spec(spec)) {
    a.names.push_back(s.name);
    if (s.integer) {
      p.int_attrs.emplace_back(s.name);
      a.values.push_back(p.int_attrs.back());
      p.args.push_back(p.int_attrs.back());
    } else {
      p.float_attrs.emplace_back(s.name);
      a.values.push_back(Halide::cast(type, p.float_attrs.back()));
      p.args.push_back(p.float_attrs.back());
    }
  }
  return a;
}

inline ImageParam add_input(Pipeline& p, Type t, int dims, const std::string& name,
                            bool any_stride) {
  ImageParam in(t, dims, name);
  if (any_stride) in.dim(0).set_stride(Expr());
  p.inputs.push_back(in);
  p.args.push_back(in);
  return in;
}

inline void estimate_attrs(Pipeline& p, int64_t int_value) {
  for (auto& f : p.float_attrs) f.set_estimate(1.0);
  for (auto& i : p.int_attrs) i.set_estimate(int32_t(int_value));
}

inline std::vector<Halide::Range> ranges(const std::vector<int64_t>& extents) {
  std::vector<Halide::Range> r;
  for (auto e : extents) r.emplace_back(0, int32_t(e));
  return r;
}

constexpr int kEwDims = 6;

// A derived gradient of a pointwise op as one expression at `at`. propagate_adjoints clamps every
// access to the output's bounds and marks it `likely`, which Halide answers by partitioning each
// of the six loops (several times the code and compile time of the forward kernel); a pointwise
// op reads every buffer at the point it writes, so the clamps are the identity and are dropped.
class AtPoint : public Halide::Internal::IRMutator {
 public:
  explicit AtPoint(std::vector<Expr> at) : at_(std::move(at)) {}
  using IRMutator::mutate;

 protected:
  using IRMutator::visit;
  // A Func is inlined at the point; a buffer is read at it.
  Expr visit(const Halide::Internal::Call* op) override {
    namespace hir = Halide::Internal;
    if (op->call_type == hir::Call::Halide && op->func.defined()) {
      hir::Function fn(op->func);
      if (fn.has_update_definition() || fn.args().size() != at_.size())
        throw std::runtime_error("derived gradient is not pointwise: " + fn.name());
      Expr v = fn.values()[size_t(op->value_index)];
      for (size_t k = 0; k < at_.size(); k++) v = hir::substitute(fn.args()[k], at_[k], v);
      return mutate(v);
    }
    if (op->call_type != hir::Call::Image || op->args.size() != at_.size())
      return IRMutator::visit(op);
    return hir::Call::make(op->type, op->name, at_, op->call_type, op->func, op->value_index,
                           op->image, op->param);
  }

 private:
  std::vector<Expr> at_;
};
inline Expr pointwise(const Func& f, const std::vector<Var>& vars) {
  std::vector<Expr> at(vars.begin(), vars.end());
  return Halide::Internal::simplify(AtPoint(at).mutate(f(at)));
}

// Estimates of the 6-D strided kernels: `size` elements in the innermost dimension.
inline std::vector<int64_t> estimate_6d(Pipeline& p, int64_t size) {
  std::vector<int64_t> ext(kEwDims, 1);
  ext[0] = size;
  for (auto& in : p.inputs) in.set_estimates(ranges(ext));
  p.out.set_estimates(ranges(ext));
  estimate_attrs(p, 1);
  return ext;
}
}  // namespace detail

template <class T>
std::string dtype_str() {
  return std::string(dtype_name(dtype_of_v<T>));
}

// The fields every family's pipeline starts with.
template <class T, class Op>
Pipeline start(const Op& op, int num_inputs, int flags = 0) {
  Pipeline p;
  p.op = op.name;
  p.family = Op::family;
  p.in_dtype = dtype_of_v<T>;
  p.out_dtype = op.out(p.in_dtype);
  p.dtype_key = dtype_str<T>();
  p.num_inputs = num_inputs;
  p.attrs = op.attrs;
  p.variant_flags = flags;
  return p;
}

// ---- elementwise ----
// dims: kEwDims for the strided kernel; 1 for its dense companion, whose buffers are contiguous.
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>,
               int dims = detail::kEwDims) requires(Op::family == Family::elementwise &&
                                                    requires { op.fn; }) {
  Pipeline p = start<T>(op, op.arity, op.bool_inputs_mask);
  Type t = halide_type<T>();
  for (int i = 0; i < dims; i++) p.vars.emplace_back("x" + std::to_string(i));
  EwArgs a;
  a.type = t;
  a.out_type = halide_type(p.out_dtype);
  for (int i = 0; i < op.arity; i++) {
    Type ti = (op.bool_inputs_mask >> i) & 1 ? Halide::UInt(8) : t;
    auto in = detail::add_input(p, ti, dims, "in" + std::to_string(i), dims > 1);
    a.in.push_back(in(p.vars));
  }
  a.attr = detail::make_attrs(p, op.attrs, t);
  p.out = Func("out");
  auto result = op.fn(a);
  if constexpr (std::is_same_v<decltype(result), std::vector<Expr>>) {
    if (int(result.size()) != op.outputs)
      throw std::runtime_error(std::string(op.name) + ": declares " + std::to_string(op.outputs) +
                               " outputs, its algorithm returns " + std::to_string(result.size()));
    std::vector<Expr> outs;
    for (const Expr& e : result) outs.push_back(Halide::cast(a.out_type, e));
    p.out(p.vars) = outs.size() == 1 ? Halide::Tuple(outs[0]) : Halide::Tuple(outs);
  } else {
    if (op.outputs != 1)
      throw std::runtime_error(std::string(op.name) + ": declares " + std::to_string(op.outputs) +
                               " outputs, its algorithm returns one");
    p.out(p.vars) = Halide::cast(a.out_type, result);
  }
  if (op.inout >= 0) {
    if (op.inout >= op.arity || op.outputs != 1 || p.out_dtype != p.in_dtype)
      throw std::runtime_error(std::string(op.name) +
                               ": an in-place op writes its one result, of its input's dtype, "
                               "into one of its inputs");
    p.inout = op.inout;
  }
  p.set_estimates = [p](int64_t size) mutable { return detail::estimate_6d(p, size); };
  return p;
}

// ---- elementwise backward: `<op>_backward`, the op's inputs and the gradient of its result in
// (the gradient last, of the result's shape), the gradient of each non-bool input out, all of one
// shape: the runtime reduces each to its input's shape where it was broadcast. The derivative is
// the op's stated one or, by default, what Halide derives from its forward math.
template <class T, class Op>
Pipeline build_backward(const Op& op, hana::basic_type<T>, int dims = detail::kEwDims) {
  Pipeline p = start<T>(op, op.arity + 1, op.bool_inputs_mask);
  p.op = backward_name(op.name);
  p.out_dtype = p.in_dtype;
  Type t = halide_type<T>();
  for (int i = 0; i < dims; i++) p.vars.emplace_back("x" + std::to_string(i));
  EwArgs a;
  a.type = a.out_type = t;
  // Each float input is read through a Func of its own, the handle propagate_adjoints gives its
  // adjoint by.
  std::vector<Func> wrapped;
  for (int i = 0; i < op.arity; i++) {
    bool is_bool = (op.bool_inputs_mask >> i) & 1;
    auto in = detail::add_input(p, is_bool ? Halide::UInt(8) : t, dims, "in" + std::to_string(i),
                                dims > 1);
    if (is_bool) {
      a.in.push_back(in(p.vars));
      continue;
    }
    wrapped.emplace_back("in" + std::to_string(i) + "_value");
    wrapped.back()(p.vars) = in(p.vars);
    a.in.push_back(wrapped.back()(p.vars));
  }
  auto grad = detail::add_input(p, t, dims, "grad", dims > 1);
  a.attr = detail::make_attrs(p, op.attrs, t);
  std::vector<Expr> grads;
  if constexpr (requires { op.grad.fn; }) {
    grads = op.grad.fn(a, grad(p.vars));
  } else {
    Func forward("forward"), adjoint("adjoint");
    auto result = op.fn(a);
    if constexpr (std::is_same_v<decltype(result), std::vector<Expr>>)
      throw std::runtime_error(p.op + ": ops with several results state their gradients");
    else
      forward(p.vars) = Halide::cast(t, result);
    adjoint(p.vars) = grad(p.vars);
    // Halide 14 reads the bounds as inclusive: {min, extent - 1} (DESIGN.md).
    Halide::Region bounds;
    for (int d = 0; d < dims; d++) bounds.emplace_back(grad.dim(d).min(), grad.dim(d).extent() - 1);
    Halide::Derivative d = Halide::propagate_adjoints(forward, adjoint, bounds);
    for (const Func& w : wrapped) grads.push_back(detail::pointwise(d(w), p.vars));
  }
  if (grads.size() != wrapped.size())
    throw std::runtime_error(p.op + ": states " + std::to_string(grads.size()) + " gradients for " +
                             std::to_string(wrapped.size()) + " float inputs");
  for (Expr& g : grads) g = Halide::cast(t, g);
  p.out = Func("out");
  p.out(p.vars) = grads.size() == 1 ? Halide::Tuple(grads[0]) : Halide::Tuple(grads);
  p.set_estimates = [p](int64_t size) mutable { return detail::estimate_6d(p, size); };
  return p;
}

// cast: a two-dtype elementwise kernel, built per (from, to) pair by the generator
inline Pipeline build_cast(DType from, DType to, int dims = detail::kEwDims) {
  Pipeline p;
  p.op = "cast";
  p.family = Family::elementwise;
  p.in_dtype = from;
  p.out_dtype = to;
  p.dtype_key = std::string(dtype_name(from)) + "_to_" + std::string(dtype_name(to));
  p.num_inputs = 1;
  for (int i = 0; i < dims; i++) p.vars.emplace_back("x" + std::to_string(i));
  auto in = detail::add_input(p, halide_type(from), dims, "in0", dims > 1);
  Expr v = in(p.vars);
  p.out = Func("out");
  p.out(p.vars) = to == DType::Bool ? as_bool(v != Halide::cast(v.type(), 0))
                                    : Halide::cast(halide_type(to), v);
  p.set_estimates = [p](int64_t size) mutable { return detail::estimate_6d(p, size); };
  return p;
}

// ---- reduction: in(i, k, o); call extents (inner, reduced, outer) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::reduction) {
  Pipeline p = start<T>(op, 1 + op.extra_inputs, int(op.kind));
  Type t = halide_type<T>();
  RedArgs a;
  a.i = Var("i");
  a.k = Var("k");
  a.o = Var("o");
  auto in = detail::add_input(p, t, 3, "in", true);
  a.in = Func(in);
  for (int e = 0; e < op.extra_inputs; e++)
    a.extra.push_back(Func(detail::add_input(p, t, 1, "extra" + std::to_string(e), false)));
  a.n = in.dim(1).extent();
  a.r = Halide::RDom(0, a.n, "r");
  a.type = t;
  a.out_type = halide_type(p.out_dtype);
  a.attr = detail::make_attrs(p, op.attrs, t);
  p.out = Func("out");
  if (op.kind == ReductionKind::reduce) {
    p.vars = {a.i, a.o};
  } else {
    p.vars = {a.i, a.k, a.o};
  }
  p.out(p.vars) = Halide::cast(a.out_type, op.fn(a));
  bool normalize = op.kind == ReductionKind::normalize;
  for (const auto& [name, f] : Halide::Internal::find_transitive_calls(p.out.function()))
    if (name != p.out.name() && f.has_update_definition()) p.reductions.emplace_back(f);
  p.set_estimates = [p, normalize](int64_t size) mutable {
    std::vector<int64_t> ext = {1, size, size};
    p.inputs[0].set_estimates(detail::ranges(ext));
    for (size_t e = 1; e < p.inputs.size(); e++) p.inputs[e].set_estimates({{0, int32_t(size)}});
    p.out.set_estimates(normalize ? detail::ranges(ext) : detail::ranges({1, size}));
    detail::estimate_attrs(p, 1);
    return ext;
  };
  return p;
}

// ---- contraction: a(k, m, b), b(n, k, b), c(n, m, b); call extents (N, M, K, batch) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::contraction) {
  Pipeline p = start<T>(op, op.has_c ? 3 : 2);
  Type t = halide_type<T>();
  ContractionArgs a;
  a.n = Var("n");
  a.m = Var("m");
  a.batch = Var("batch");
  auto A = detail::add_input(p, t, 3, "a", false);
  auto B = detail::add_input(p, t, 3, "b", false);
  a.a = Func(A);
  a.b = Func(B);
  if (op.has_c) a.c = Func(detail::add_input(p, t, 3, "c", true));
  a.r = Halide::RDom(0, A.dim(0).extent(), "r");
  a.type = t;
  a.attr = detail::make_attrs(p, op.attrs, t);
  AccOut ao = op.fn(a);
  p.acc = ao.acc;
  p.out = ao.out;
  p.vars = {a.n, a.m, a.batch};
  p.set_estimates = [p](int64_t size) mutable {
    p.inputs[0].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    p.inputs[1].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    if (p.inputs.size() > 2)
      p.inputs[2].set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    p.out.set_estimates({{0, int32_t(size)}, {0, int32_t(size)}, {0, 1}});
    detail::estimate_attrs(p, 1);
    return std::vector<int64_t>{size, size, size, 1};
  };
  return p;
}

// ---- window: in(w, h, c, n); call extents are the output's (W, H, C, N) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::window) {
  bool conv = op.kind == WindowKind::conv;
  Pipeline p = start<T>(op, conv ? 3 : 1, int(op.kind));
  Type t = halide_type<T>();
  WindowArgs a;
  a.w = Var("w");
  a.h = Var("h");
  a.c = Var("c");
  a.n = Var("n");
  auto in = detail::add_input(p, t, 4, "in", false);
  a.in = Halide::BoundaryConditions::constant_exterior(in, Halide::cast(t, 0));
  p.padded = a.in;
  a.in_w = in.dim(0).extent();
  a.in_h = in.dim(1).extent();
  a.in_c = in.dim(2).extent();
  a.type = t;
  if (conv) {
    auto w = detail::add_input(p, t, 4, "weight", false);
    a.weight = Func(w);
    a.bias = Func(detail::add_input(p, t, 1, "bias", false));
    a.kernel_w = w.dim(0).extent();
    a.kernel_h = w.dim(1).extent();
    a.out_c = w.dim(3).extent();
  }
  a.attr = detail::make_attrs(p, op.attrs, t);
  if (!conv) {
    a.kernel_h = a.attr["kernel_h"];
    a.kernel_w = a.attr["kernel_w"];
  }
  AccOut ao = op.fn(a);
  p.acc = ao.acc;
  p.out = ao.out;
  p.vars = {a.w, a.h, a.c, a.n};
  p.set_estimates = [p, conv](int64_t size) mutable {
    // size: spatial extent; 16 channels, batch 1, 3x3 kernels, stride 1, padding 1
    int32_t s = int32_t(size);
    p.inputs[0].set_estimates({{0, s}, {0, s}, {0, 16}, {0, 1}});
    if (conv) {
      p.inputs[1].set_estimates({{0, 3}, {0, 3}, {0, 16}, {0, 16}});
      p.inputs[2].set_estimates({{0, 16}});
    }
    p.out.set_estimates({{0, s}, {0, s}, {0, 16}, {0, 1}});
    for (auto& f : p.float_attrs) f.set_estimate(1.0);
    for (auto& i : p.int_attrs) {
      std::string n = i.name();
      i.set_estimate(n.rfind("kernel", 0) == 0 ? 3 : n.rfind("pad", 0) == 0 ? 1 : 1);
    }
    return std::vector<int64_t>{size, size, 16, 1};
  };
  return p;
}

// ---- movement: copy(in, 6-D, any strides) and gather(in(i, k, o), index(j)) ----
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::movement) {
  Pipeline p = start<T>(op, op.kind == MovementKind::copy ? 1 : 2, int(op.kind));
  Type t = halide_type<T>();
  p.out = Func("out");
  if (op.kind == MovementKind::copy) {
    for (int i = 0; i < detail::kEwDims; i++) p.vars.emplace_back("x" + std::to_string(i));
    auto in = detail::add_input(p, t, detail::kEwDims, "in", true);
    p.out(p.vars) = in(p.vars);
    p.out.output_buffer().dim(0).set_stride(Expr());
    p.set_estimates = [p](int64_t size) mutable { return detail::estimate_6d(p, size); };
  } else {
    Var i("i"), j("j"), o("o");
    auto in = detail::add_input(p, t, 3, "in", true);
    auto index = detail::add_input(p, Halide::Int(64), 1, "index", true);
    Expr n = in.dim(1).extent();
    Expr idx = Halide::cast<int32_t>(index(j));
    idx = Halide::clamp(Halide::select(idx < 0, idx + n, idx), 0, n - 1);
    p.out(i, j, o) = in(i, idx, o);
    p.out.output_buffer().dim(0).set_stride(Expr());
    p.vars = {i, j, o};
    // Gathers are mostly rows of an embedding table: estimate 256 rows of size/256 elements.
    p.set_estimates = [p](int64_t size) mutable {
      int32_t rows = 256, inner = int32_t(std::max<int64_t>(size / rows, 1));
      p.inputs[0].set_estimates({{0, inner}, {0, rows}, {0, 1}});
      p.inputs[1].set_estimates({{0, rows}});
      p.out.set_estimates({{0, inner}, {0, rows}, {0, 1}});
      return std::vector<int64_t>{inner, rows, 1};
    };
  }
  return p;
}

}  // namespace opforge::gen
