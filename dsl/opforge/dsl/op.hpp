// The op definition types of the DSL. An op is its name, family, dtype list (a Boost.Hana list
// of C++ element types), attributes, output dtype rule and Halide algorithm: nothing about
// schedules, targets or variants, which the generators and schedules/ add.
#pragma once
#include <Halide.h>

#include <bit>
#include <boost/hana.hpp>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "opforge/dtype.hpp"
#include "opforge/kernel_abi.hpp"

namespace opforge::dsl {

namespace hana = boost::hana;
using Halide::Expr;
using Halide::Func;
using Halide::Type;

enum class Family { elementwise, reduction, contraction, window, movement };

inline const char* family_name(Family f) {
  switch (f) {
    case Family::elementwise:
      return "elementwise";
    case Family::reduction:
      return "reduction";
    case Family::contraction:
      return "contraction";
    case Family::window:
      return "window";
    case Family::movement:
      return "movement";
  }
  return "?";
}

// Dtype lists: compile-time lists of element types.
inline constexpr auto floats = hana::tuple_t<float, double>;
inline constexpr auto ints = hana::tuple_t<int32_t, int64_t>;
inline constexpr auto numeric = hana::tuple_t<int32_t, int64_t, float, double>;
inline constexpr auto signed_numeric = numeric;
inline constexpr auto bools = hana::tuple_t<bool>;
inline constexpr auto all_types = hana::tuple_t<bool, int32_t, int64_t, float, double>;

// Element type of a C++ type as Halide stores it (bool is one byte).
template <class T>
Type halide_type() {
  if constexpr (std::is_same_v<T, bool>) {
    return Halide::UInt(8);
  } else {
    return Halide::type_of<T>();
  }
}

inline Type halide_type(DType t) {
  switch (t) {
    case DType::Bool:
      return Halide::UInt(8);
    case DType::Int32:
      return Halide::Int(32);
    case DType::Int64:
      return Halide::Int(64);
    case DType::Float32:
      return Halide::Float(32);
    case DType::Float64:
      return Halide::Float(64);
  }
  return Type();
}

// Output dtype rules: the result element type as a function of the (first) input's.
using OutRule = DType (*)(DType);
constexpr DType same(DType t) { return t; }
constexpr DType to_bool(DType) { return DType::Bool; }
constexpr DType to_int64(DType) { return DType::Int64; }
// Integer sums and products accumulate in int64, as in NumPy and PyTorch.
constexpr DType widen_int(DType t) { return is_floating(t) ? t : DType::Int64; }

// What an algorithm sees: its inputs as expressions or Funcs, its attributes as expressions
// (scalar parameters of the generated kernel), and the element types involved.
struct Attrs {
  std::vector<std::string> names;
  std::vector<Expr> values;
  Expr operator[](const char* name) const {
    for (size_t i = 0; i < names.size(); i++)
      if (names[i] == name) return values[i];
    throw std::runtime_error(std::string("op uses an attribute it does not declare: ") + name);
  }
};

inline Expr as_bool(const Expr& e) { return Halide::cast(Halide::UInt(8), e); }

// ---- elementwise: out(x) = fn(in_0(x), ..., in_{n-1}(x)) over broadcast views ----
struct EwArgs {
  std::vector<Expr> in;
  Attrs attr;
  Type type;      // element type of the (promoted) inputs
  Type out_type;  // element type of the result
  Expr operator[](size_t i) const { return in.at(i); }
};

// How an elementwise op's backward kernel (`<name>_backward`: the op's inputs and the gradient of
// its result in, the gradient of each non-bool input out) is made. Derived: Halide derives it from
// the forward math (propagate_adjoints). Stated: the op states it as DSL expressions, where the
// derived one is wrong (a kink or tie where PyTorch's convention differs, a clamped special value)
// or an approximation's (erf, gelu). Zero: the derivative is zero wherever it is defined (floor,
// sign), so no kernel is built. Comparisons and logic need no marker: their results are bool, and
// the runtime records no gradient for a bool or integer result. The runtime reads an op with one
// floating result and no backward kernel as a zero-gradient op, so every other such op must get
// one (has_backward below).
struct DerivedGrad {};
struct ZeroGrad {};
template <class S>
struct StatedGrad {
  S fn;  // fn(EwArgs a, Expr grad) -> std::vector<Expr>: d out / d in_i * grad per non-bool input
};

// fn returns one Expr, or a std::vector<Expr> with one Expr per output (every output has the
// op's output dtype).
template <class Dtypes, class Fn, class Grad = DerivedGrad>
struct ElementwiseOp {
  static constexpr Family family = Family::elementwise;
  const char* name;
  int arity;
  Dtypes dtypes;
  const char* attrs;
  OutRule out;
  Fn fn;
  int bool_inputs_mask = 0;  // inputs that are always bool (the condition of `where`)
  int outputs = 1;           // how many results fn returns
  // Inputs written in place (inout buffers), bit i for input i: the results, in input order, are
  // written into them instead of into buffers of their own (an optimiser step updates a
  // parameter and its moments).
  int inout_mask = 0;
  Grad grad = {};
};

// Whether an op gets a backward kernel: one result of its input's dtype, not in place, and a
// gradient that is not zero. Built for the op's floating dtypes only.
template <class Dtypes, class Fn, class Grad>
bool has_backward(const ElementwiseOp<Dtypes, Fn, Grad>& op) {
  return !std::is_same_v<Grad, ZeroGrad> && op.outputs == 1 && op.inout_mask == 0 && op.out == same;
}

template <class Dtypes, class Fn>
constexpr auto unary(const char* name, Dtypes d, Fn fn, OutRule out = same) {
  return ElementwiseOp<Dtypes, Fn>{name, 1, d, "", out, fn};
}
template <class Dtypes, class Fn>
constexpr auto unary_attr(const char* name, Dtypes d, const char* attrs, Fn fn) {
  return ElementwiseOp<Dtypes, Fn>{name, 1, d, attrs, same, fn};
}
template <class Dtypes, class Fn>
constexpr auto binary(const char* name, Dtypes d, Fn fn, OutRule out = same) {
  return ElementwiseOp<Dtypes, Fn>{name, 2, d, "", out, fn};
}
// An op with several results, each a buffer of its own: sincos -> (sin, cos).
template <class Dtypes, class Fn>
constexpr auto multi_output(const char* name, int arity, int outputs, Dtypes d, Fn fn) {
  return ElementwiseOp<Dtypes, Fn>{name, arity, d, "", same, fn, 0, outputs};
}
// An op that writes its result into input `inout` (an inout buffer): axpy_: y += alpha * x.
template <class Dtypes, class Fn>
constexpr auto in_place(const char* name, int arity, int inout, Dtypes d, const char* attrs,
                        Fn fn) {
  return ElementwiseOp<Dtypes, Fn>{name, arity, d, attrs, same, fn, 0, 1, 1 << inout};
}
// An op that updates several of its inputs in place (the bits of inout_mask): fn returns their new
// values, in input order. Optimiser steps: a parameter and its state in one pass.
template <class Dtypes, class Fn>
constexpr auto updates(const char* name, int arity, int inout_mask, Dtypes d, const char* attrs,
                       Fn fn) {
  return ElementwiseOp<Dtypes, Fn>{
      name, arity, d, attrs, same, fn, 0, std::popcount(unsigned(inout_mask)), inout_mask};
}
// The op with another way to its gradient.
template <class Grad, class Dtypes, class Fn, class G>
constexpr auto regrad(const ElementwiseOp<Dtypes, Fn, G>& op, Grad grad) {
  return ElementwiseOp<Dtypes, Fn, Grad>{op.name,       op.arity, op.dtypes,           op.attrs,
                                         op.out,        op.fn,    op.bool_inputs_mask, op.outputs,
                                         op.inout_mask, grad};
}
// The op with its derivative stated: grad(a, g) returns d out / d in_i * g for each non-bool
// input i, in input order.
template <class Op, class S>
constexpr auto with_grad(const Op& op, S stated) {
  return regrad(op, StatedGrad<S>{stated});
}
// The op's derivative is zero wherever it is defined (piecewise constant: floor, sign).
template <class Op>
constexpr auto zero_grad(const Op& op) {
  return regrad(op, ZeroGrad{});
}
template <class Dtypes, class Fn>
constexpr auto compare(const char* name, Dtypes d, Fn fn) {
  return ElementwiseOp<Dtypes, Fn>{name, 2, d, "", to_bool, fn};
}

// ---- reduction: canonical view in(i, k, o) = (inner, reduced, outer) ----
struct RedArgs {
  Func in;                  // in(i, k, o)
  std::vector<Func> like;   // more inputs of in's shape, like(i, k, o) (a gradient's g)
  std::vector<Func> extra;  // 1-D inputs indexed by k (layer_norm's weight and bias)
  Halide::Var i, o, k;
  Halide::RDom r;  // over the reduced extent
  Expr n;          // reduced extent
  // A per_channel op keeps k (batch_norm's channels) and reduces over every (i, o): `across` runs
  // over them and `count` is their number (inner x outer).
  Halide::RDom across;
  Expr count;
  // A channel_normalize op's per-channel results, channel(k)[j], which its output may read.
  Func channel;
  Attrs attr;
  Type type, out_type;
  Expr x(const Expr& kk) const { return in(i, kk, o); }
  Expr like_at(size_t j, const Expr& kk) const { return like[j](i, kk, o); }
  // x and the inputs of its shape at channel k, at `across`'s point.
  Expr x_across() const { return in(across.x, k, across.y); }
  Expr like_across(size_t j) const { return like[j](across.x, k, across.y); }
};

// reduce: out(i, o); normalize: out(i, k, o); per_channel: out(k), a Tuple of results per channel
// (reduced over i and o, the statistics batch normalisation needs); channel_normalize: both a
// per_channel op's results, as outputs of their own shape, and out(i, k, o), which may read them
// (batch normalisation in one kernel: the statistics and the normalised tensor).
enum class ReductionKind { reduce, normalize, per_channel, channel_normalize };

template <class Dtypes, class Fn, class ChannelFn = std::nullptr_t>
struct ReductionOp {
  static constexpr Family family = Family::reduction;
  const char* name;
  ReductionKind kind;
  Dtypes dtypes;
  const char* attrs;
  OutRule out;
  Fn fn;  // returns the output expression at (i, o) or (i, k, o), or a Tuple at (k)
  int extra_inputs = 0;
  int like_inputs = 0;
  ChannelFn channel_fn = {};  // channel_normalize: returns the Tuple at (k)
  bool row_view = false;      // row_normalize: k the rows, i their elements (estimates follow)
};

template <class Dtypes, class Fn>
constexpr auto reduce(const char* name, Dtypes d, Fn fn, OutRule out = same,
                      const char* attrs = "") {
  return ReductionOp<Dtypes, Fn>{name, ReductionKind::reduce, d, attrs, out, fn};
}
template <class Dtypes, class Fn>
constexpr auto normalize(const char* name, Dtypes d, Fn fn, const char* attrs = "",
                         int extra_inputs = 0) {
  return ReductionOp<Dtypes, Fn>{name, ReductionKind::normalize, d, attrs, same, fn, extra_inputs};
}
// A reduce op that reads `like_inputs` more tensors of its input's shape (after `in`, in order).
template <class Dtypes, class Fn>
constexpr auto reduce_like(const char* name, Dtypes d, int like_inputs, Fn fn) {
  return ReductionOp<Dtypes, Fn>{name, ReductionKind::reduce, d, "", same, fn, 0, like_inputs};
}
// A normalize op that reads `like_inputs` more tensors of its input's shape (a normalize op's
// gradient reads its result and the result's gradient); they come after `in`, in order.
template <class Dtypes, class Fn>
constexpr auto normalize_like(const char* name, Dtypes d, int like_inputs, Fn fn,
                              const char* attrs = "", int extra_inputs = 0) {
  return ReductionOp<Dtypes, Fn>{
      name, ReductionKind::normalize, d, attrs, same, fn, extra_inputs, like_inputs};
}

// A per_channel op: out(k) is the Tuple fn returns, from in(i, k, o), `like_inputs` tensors of its
// shape and `extra_inputs` 1-D inputs indexed by k.
template <class Dtypes, class Fn>
constexpr auto per_channel(const char* name, Dtypes d, int like_inputs, Fn fn,
                           const char* attrs = "", int extra_inputs = 0) {
  return ReductionOp<Dtypes, Fn>{
      name, ReductionKind::per_channel, d, attrs, same, fn, extra_inputs, like_inputs};
}

// A channel_normalize op: `channel` returns the Tuple of per-channel results at k (as a per_channel
// op's fn: reduced over `across`), each an output of shape (k); `fn` returns out(i, k, o), reading
// them as a.channel(a.k)[j]. Its inputs are a per_channel op's.
template <class Dtypes, class ChannelFn, class Fn>
constexpr auto channel_normalize(const char* name, Dtypes d, int like_inputs, ChannelFn channel,
                                 Fn fn, const char* attrs = "", int extra_inputs = 0) {
  return ReductionOp<Dtypes, Fn, ChannelFn>{
      name,   ReductionKind::channel_normalize, d, attrs, same, fn, extra_inputs, like_inputs,
      channel};
}

// A channel_normalize op on the view in(i, k, o) = (D, rows, 1) of a (rows, D) tensor: each
// "channel" k is a row, whose results (a Tuple, reduced over `across`, that is over its D elements
// i) are outputs of shape (rows) that the backward pass can save, as PyTorch's layer_norm saves
// each row's mean and rstd. Extra inputs are 1-D and may be indexed by i (a weight over the row's
// elements) or by k (a row's saved statistics).
template <class Dtypes, class ChannelFn, class Fn>
constexpr auto row_normalize(const char* name, Dtypes d, int like_inputs, ChannelFn channel, Fn fn,
                             const char* attrs = "", int extra_inputs = 0) {
  auto op = channel_normalize(name, d, like_inputs, channel, fn, attrs, extra_inputs);
  op.row_view = true;
  return op;
}

// ---- contraction: batched (B, M, K) x (B, K, N); Halide order a(k, m, batch), b(n, k, batch) ----
// (b is a Func over the B buffer in either layout, always indexed (n, k, batch).)
// Contraction and window algorithms return the accumulating Func and the output Func, so that a
// hand schedule can tile the accumulation and compute it inside the output's tiles.
struct AccOut {
  Func acc, out;
};

struct ContractionArgs {
  Func a, b, c;  // c(n, m, batch) only for ops with has_c
  Halide::Var n, m, batch;
  Halide::RDom r;  // over K
  Attrs attr;
  Type type;
};

// How B is stored. `kn`: (K, N) row-major, as matmul takes it. `nk`: (N, K) row-major, a linear
// layer's weight (out_features, in_features): the kernel reads it as B^T without a transposed copy,
// and its hand schedule is a dot product along K (schedules/contraction.hpp).
enum class BLayout { kn, nk };

template <class Dtypes, class Fn>
struct ContractionOp {
  static constexpr Family family = Family::contraction;
  const char* name;
  Dtypes dtypes;
  const char* attrs;
  bool has_c;
  Fn fn;
  BLayout b_layout = BLayout::kn;
  OutRule out = same;
};

template <class Dtypes, class Fn>
constexpr auto contraction(const char* name, Dtypes d, const char* attrs, bool has_c, Fn fn,
                           BLayout b_layout = BLayout::kn) {
  return ContractionOp<Dtypes, Fn>{name, d, attrs, has_c, fn, b_layout};
}

// ---- window: N, C, H, W images; Halide order in(w, h, c, n) ----
// What a window op computes, and so which buffers its kernel takes (in this order) and what its
// output's four dimensions are:
//   conv              in, weight, bias -> out(w, h, co, n)
//   pool              in               -> out(w, h, c, n)
//   conv_grad_input   grad, weight     -> out(x, y, ci, n): the gradient of conv's input, a
//                                         transposed convolution
//   conv_grad_weight  in, grad         -> out(kx, ky, ci, co): the gradient of conv's weight
//   pool_grad         in, grad         -> out(x, y, c, n): the gradient of a pool's input
//   pool_grad_indices grad, indices    -> out(x, y, c, n): the same from the forward's saved
//                                         indices (int64, as grad; -1 outside it), without `in`
// A pool may give several outputs (a Tuple: max_pool2d_with_indices' values and indices).
// The gradient kinds read `grad`, the gradient of the forward op's output, zero outside it.
enum class WindowKind {
  conv,
  pool,
  conv_grad_input,
  conv_grad_weight,
  pool_grad,
  pool_grad_indices
};
constexpr bool is_gradient(WindowKind k) {
  return k == WindowKind::conv_grad_input || k == WindowKind::conv_grad_weight ||
         k == WindowKind::pool_grad || k == WindowKind::pool_grad_indices;
}

struct WindowArgs {
  Func in;      // in(w, h, c, n), zero outside the image (not conv_grad_input, pool_grad_indices)
  Func weight;  // weight(kw, kh, ci, co): conv, conv_grad_input
  Func bias;    // bias(co): conv
  Func grad;    // grad(wo, ho, co, n), zero outside it: the gradient kinds
  Func grad_inside;       // the same without the zero border, for reads that stay inside it
  Func indices;           // indices(wo, ho, c, n), -1 outside them: pool_grad_indices
  Expr in_w, in_h, in_c;  // in's extents (pool_grad_indices: in_w, its `in_w` attribute)
  Expr grad_w, grad_h, grad_c, grad_n;  // grad's extents
  Expr out_c;                           // weight's dim 3: conv's output channels
  Expr group_c;                         // weight's dim 2: conv's input channels per group
  Expr kernel_w, kernel_h;              // weight's extents, or the kernel_h, kernel_w attributes
  Halide::Var w, h, c, n;               // the output's dimensions, innermost first
  Attrs attr;
  Type type;
  // True where (x, y) lies inside the unpadded image.
  Expr inside(const Expr& x, const Expr& y) const {
    return x >= 0 && x < in_w && y >= 0 && y < in_h;
  }
};

template <class Dtypes, class Fn>
struct WindowOp {
  static constexpr Family family = Family::window;
  const char* name;
  WindowKind kind;
  Dtypes dtypes;
  const char* attrs;
  Fn fn;
  OutRule out = same;
};

template <class Dtypes, class Fn>
constexpr auto window(const char* name, WindowKind kind, Dtypes d, const char* attrs, Fn fn) {
  return WindowOp<Dtypes, Fn>{name, kind, d, attrs, fn};
}

// ---- movement: strided copies ----
// copy: a strided copy; gather: out(i, j, o) = in(i, index(j), o); index_add: out = dest, then
// out(i, index(j), o) += src(i, j, o) for every j (PyTorch's index_add, index_select's gradient).
enum class MovementKind { copy, gather, index_add };

template <class Dtypes>
struct MovementOp {
  static constexpr Family family = Family::movement;
  const char* name;
  MovementKind kind;
  Dtypes dtypes;
  const char* attrs = "";
  OutRule out = same;
};

template <class Dtypes>
constexpr auto movement(const char* name, MovementKind kind, Dtypes d) {
  return MovementOp<Dtypes>{name, kind, d};
}

// ---- cast: one kernel per (from, to) pair of the list, from != to ----
template <class Dtypes>
struct CastOp {
  static constexpr Family family = Family::elementwise;
  const char* name;
  Dtypes dtypes;
  const char* attrs = "";
};

// Calls the C library's function of that name (with the f suffix for float32): for the few
// functions Halide has no vectorizable form of at the precision we need.
inline Expr libm(const std::string& fn, const Expr& x) {
  using namespace Halide::Internal;
  bool f32 = x.type() == Halide::Float(32);
  return Call::make(x.type(), f32 ? fn + "f" : fn, {x}, Call::PureExtern);
}

}  // namespace opforge::dsl
