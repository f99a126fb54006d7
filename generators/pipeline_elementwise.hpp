// Elementwise pipelines: the op over six strided dims (or one dense one), its backward kernel, and
// the casts.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

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
  std::vector<Expr> reads;
  for (int i = 0; i < op.arity; i++) {
    Type ti = (op.bool_inputs_mask >> i) & 1 ? Halide::UInt(8) : t;
    auto in = detail::add_input(p, ti, dims, "in" + std::to_string(i), dims > 1);
    reads.push_back(in(p.vars));
  }
  if (std::popcount(unsigned(op.inout_mask)) > 1) {
    // Results written over several inputs: the algorithm reads them through `staged`.
    p.staged = Func("staged");
    p.staged(p.vars) = Halide::Tuple(reads);
    for (int i = 0; i < op.arity; i++) a.in.push_back(p.staged(p.vars)[i]);
  } else {
    a.in = reads;
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
  if (op.inout_mask) {
    if (op.inout_mask >> op.arity || std::popcount(unsigned(op.inout_mask)) != op.outputs ||
        p.out_dtype != p.in_dtype || (op.inout_mask & op.bool_inputs_mask))
      throw std::runtime_error(std::string(op.name) +
                               ": an in-place op writes each result, of its input's dtype, into "
                               "one of its (non-bool) inputs");
    p.inout_mask = op.inout_mask;
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

}  // namespace opforge::gen
