// Window pipelines: convolutions, pools and their gradients on NCHW images.
#pragma once
#include "generators/pipeline.hpp"

namespace opforge::gen {

// ---- window: images (w, h, c, n); call extents are the output's (W, H, C, N) ----
// The buffers each kind takes are listed with WindowKind (dsl/opforge/dsl/op.hpp). Every image is
// read through a zero border (Halide's constant_exterior; a schedule may materialise the one in
// `p.padded` once per call), but for conv2d_backward_input's gradient, whose taps stay inside it.
// A pool's saved indices are read through a border of -1, which no input point has.
template <class T, class Op>
Pipeline build(const Op& op, hana::basic_type<T>) requires(Op::family == Family::window) {
  const WindowKind kind = op.kind;
  const bool conv = kind == WindowKind::conv, grad_input = kind == WindowKind::conv_grad_input,
             from_indices = kind == WindowKind::pool_grad_indices;
  Pipeline p = start<T>(op, conv ? 3 : is_gradient(kind) ? 2 : 1, int(kind));
  Type t = halide_type<T>();
  WindowArgs a;
  a.w = Var("w");
  a.h = Var("h");
  a.c = Var("c");
  a.n = Var("n");
  a.type = t;
  auto zero_border = [&](const ImageParam& b) {
    return Halide::BoundaryConditions::constant_exterior(b, Halide::cast(t, 0));
  };
  auto read_grad = [&] {
    auto g = detail::add_input(p, t, 4, "grad", false);
    a.grad_inside = Func(g);
    a.grad = zero_border(g);
    a.grad_w = g.dim(0).extent();
    a.grad_h = g.dim(1).extent();
    a.grad_c = g.dim(2).extent();
    a.grad_n = g.dim(3).extent();
  };
  auto read_weight = [&] {
    auto w = detail::add_input(p, t, 4, "weight", false);
    a.weight = Func(w);
    a.kernel_w = w.dim(0).extent();
    a.kernel_h = w.dim(1).extent();
    a.group_c = w.dim(2).extent();
    a.out_c = w.dim(3).extent();
  };
  if (grad_input) {  // its taps stay inside the gradient: no border to materialise
    read_grad();
    read_weight();
  } else if (from_indices) {
    read_grad();
    auto indices = detail::add_input(p, Halide::Int(64), 4, "indices", false);
    a.indices = Halide::BoundaryConditions::constant_exterior(indices, Expr(int64_t(-1)));
  } else {
    auto in = detail::add_input(p, t, 4, "in", false);
    a.in = zero_border(in);
    p.padded = a.in;
    a.in_w = in.dim(0).extent();
    a.in_h = in.dim(1).extent();
    a.in_c = in.dim(2).extent();
    if (conv) {
      read_weight();
      a.bias = Func(detail::add_input(p, t, 1, "bias", false));
    } else if (is_gradient(kind)) {
      read_grad();
    }
  }
  a.attr = detail::make_attrs(p, op.attrs, t);
  if (kind == WindowKind::pool || kind == WindowKind::pool_grad || from_indices) {
    a.kernel_h = a.attr["kernel_h"];
    a.kernel_w = a.attr["kernel_w"];
  }
  if (from_indices) a.in_w = a.attr["in_w"];
  AccOut ao = op.fn(a);
  p.acc = ao.acc;
  p.out = ao.out;
  p.vars = {a.w, a.h, a.c, a.n};
  p.set_estimates = [p, kind](int64_t size) mutable {
    // size: spatial extent; 16 channels, batch 1, 3x3 kernels, stride 1, padding 1
    int32_t s = int32_t(size);
    const Halide::Region image = {{0, s}, {0, s}, {0, 16}, {0, 1}},
                         weight = {{0, 3}, {0, 3}, {0, 16}, {0, 16}};
    p.inputs[0].set_estimates(image);
    if (kind == WindowKind::conv) {
      p.inputs[1].set_estimates(weight);
      p.inputs[2].set_estimates({{0, 16}});
    } else if (kind == WindowKind::conv_grad_input) {
      p.inputs[1].set_estimates(weight);
    } else if (is_gradient(kind)) {
      p.inputs[1].set_estimates(image);
    }
    bool weight_out = kind == WindowKind::conv_grad_weight;
    p.out.set_estimates(weight_out ? weight : image);
    for (auto& f : p.float_attrs) f.set_estimate(1.0);
    for (auto& i : p.int_attrs) {
      std::string n = i.name();
      i.set_estimate(n.rfind("kernel", 0) == 0 ? 3 : n == "in_w" ? s : 1);
    }
    return weight_out ? std::vector<int64_t>{3, 3, 16, 16}
                      : std::vector<int64_t>{size, size, 16, 1};
  };
  return p;
}

}  // namespace opforge::gen
