// Window ops on NCHW images: convolution and pooling, and their gradients. Output extents come
// from the output buffer, which the runtime sizes from the attributes. The gradients are gathers:
// each output element sums what reaches it, so no two threads write one element.
#pragma once
#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;

namespace detail {
// Input coordinates of kernel tap (rx, ry) of the window at output (wo, ho), by default the op's
// own output point.
inline Expr tap_x(const WindowArgs& a, const Expr& wo, const Expr& rx, const Expr& dil = 1) {
  return wo * a.attr["stride_w"] - a.attr["pad_w"] + rx * dil;
}
inline Expr tap_y(const WindowArgs& a, const Expr& ho, const Expr& ry, const Expr& dil = 1) {
  return ho * a.attr["stride_h"] - a.attr["pad_h"] + ry * dil;
}
inline Expr window_x(const WindowArgs& a, const Expr& rx, const Expr& dil = 1) {
  return tap_x(a, a.w, rx, dil);
}
inline Expr window_y(const WindowArgs& a, const Expr& ry, const Expr& dil = 1) {
  return tap_y(a, a.h, ry, dil);
}

// The pools' gradient: the windows that cover input (x, y) are the `reach` ones ending at
// wo = (x + pad) / stride (at most (kernel - 1) / stride + 1 each way); `contribution` says what
// window (wo, ho) gives back to (x, y).
template <class Contribution>
AccOut pool_gradient(const WindowArgs& a, Contribution contribution) {
  Expr reach_w = (a.kernel_w - 1) / a.attr["stride_w"] + 1,
       reach_h = (a.kernel_h - 1) / a.attr["stride_h"] + 1;
  Halide::RDom r(0, reach_w, 0, reach_h);
  Expr wo = (a.w + a.attr["pad_w"]) / a.attr["stride_w"] - r.x,
       ho = (a.h + a.attr["pad_h"]) / a.attr["stride_h"] - r.y;
  Expr covers = wo >= 0 && wo < a.grad_w && ho >= 0 && ho < a.grad_h &&
                a.w - tap_x(a, wo, 0) < a.kernel_w && a.h - tap_y(a, ho, 0) < a.kernel_h;
  Func acc("acc"), out("out");
  acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, 0);
  acc(a.w, a.h, a.c, a.n) += Halide::select(covers, contribution(wo, ho), Halide::cast(a.type, 0));
  out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n);
  return AccOut{acc, out};
}

// A NaN. Window kernels are compiled with fast math (fused multiply-adds for the convolutions),
// under which the CPU code generator folds is_nan away; it is told by its bits there. The bit test
// in turn misses float64 NaNs in PoCL's OpenCL, where is_nan holds: either one says NaN.
// The bits are compared as signed integers (the sign masked off, so both sides are non-negative):
// x86 has no unsigned vector comparison (and no 64-bit one before SSE4.2).
inline Expr any_nan(const Expr& v) {
  Expr bits = v.type() == Halide::Float(32)
                  ? (Halide::reinterpret(Halide::Int(32), v) & Expr(int32_t(0x7fffffff))) >
                        Expr(int32_t(0x7f800000))
                  : (Halide::reinterpret(Halide::Int(64), v) &
                     Expr(int64_t(0x7fffffffffffffffll))) > Expr(int64_t(0x7ff0000000000000ll));
  return Halide::is_nan(v) || bits;
}
// max_pool2d's rule, PyTorch's: a tap replaces the window's maximum so far when it is greater or
// a NaN. It starts from the window's first tap inside the image rather than from a -inf constant
// (which fast math may assume away) and never compares with a NaN (Halide 14's strict_float() of a
// comparison gives wrong results).
inline Expr takes_max(const Expr& v, const Expr& cur) {
  return any_nan(v) || (!any_nan(cur) && v > cur);
}
// Whether tap (x, y) of a pool's window lies inside the image. Pools size their output by floor
// division, so without padding along an axis every window lies inside along it: written so that
// a schedule specialised on no padding tests nothing.
inline Expr pool_tap_inside(const WindowArgs& a, const Expr& x, const Expr& y) {
  return (a.attr["pad_w"] == 0 || (x >= 0 && x < a.in_w)) &&
         (a.attr["pad_h"] == 0 || (y >= 0 && y < a.in_h));
}
// Without padding, the first tap itself: written so that a schedule specialised on no padding sees
// a plain stride (a vector of windows then loads densely rather than lane by lane).
inline Expr first_x(const WindowArgs& a, const Expr& wo) {
  return Halide::select(a.attr["pad_w"] == 0, tap_x(a, wo, 0), Halide::max(tap_x(a, wo, 0), 0));
}
inline Expr first_y(const WindowArgs& a, const Expr& ho) {
  return Halide::select(a.attr["pad_h"] == 0, tap_y(a, ho, 0), Halide::max(tap_y(a, ho, 0), 0));
}

// avg_pool2d's divisor for the window at (wo, ho): the whole kernel, or its part inside the image.
inline Expr avg_count(const WindowArgs& a, const Expr& wo, const Expr& ho) {
  Expr x0 = tap_x(a, wo, 0), y0 = tap_y(a, ho, 0);
  Expr valid = (Halide::min(x0 + a.kernel_w, a.in_w) - Halide::max(x0, 0)) *
               (Halide::min(y0 + a.kernel_h, a.in_h) - Halide::max(y0, 0));
  return Halide::select(a.attr["count_include_pad"] != 0, a.kernel_w * a.kernel_h, valid);
}
}  // namespace detail

inline const auto window_ops = hana::make_tuple(
    window("conv2d", WindowKind::conv, floats,
           "stride_h:i,stride_w:i,pad_h:i,pad_w:i,dil_h:i,dil_w:i,groups:i",
           [](const WindowArgs& a) {
             Expr cin_g = a.in_c / a.attr["groups"], cout_g = a.out_c / a.attr["groups"];
             Halide::RDom r(0, a.kernel_w, 0, a.kernel_h, 0, cin_g);
             // Written so that a schedule specialised on groups == 1 sees a constant group.
             Expr group = Halide::select(a.attr["groups"] == 1, 0, a.c / cout_g);
             Expr x = detail::window_x(a, r.x, a.attr["dil_w"]),
                  y = detail::window_y(a, r.y, a.attr["dil_h"]);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, 0);
             acc(a.w, a.h, a.c, a.n) +=
                 a.in(x, y, group * cin_g + r.z, a.n) * a.weight(r.x, r.y, r.z, a.c);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n) + a.bias(a.c);
             return AccOut{acc, out};
           }),
    window("max_pool2d", WindowKind::pool, floats,
           "kernel_h:i,kernel_w:i,stride_h:i,stride_w:i,pad_h:i,pad_w:i",
           [](const WindowArgs& a) {
             Halide::RDom r(0, a.kernel_w, 0, a.kernel_h);
             Expr x = detail::window_x(a, r.x), y = detail::window_y(a, r.y);
             Expr v = a.in(x, y, a.c, a.n);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) =
                 a.in(detail::first_x(a, a.w), detail::first_y(a, a.h), a.c, a.n);
             Expr cur = acc(a.w, a.h, a.c, a.n);
             acc(a.w, a.h, a.c, a.n) = Halide::select(
                 detail::pool_tap_inside(a, x, y) && detail::takes_max(v, cur), v, cur);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n);
             return AccOut{acc, out};
           }),
    // max_pool2d that also gives where each window's maximum lies in its input plane (h * W + w,
    // int64: PyTorch's indices), by the same rule: what the gradient reads rather than finding the
    // maximum again.
    window("max_pool2d_with_indices", WindowKind::pool, floats,
           "kernel_h:i,kernel_w:i,stride_h:i,stride_w:i,pad_h:i,pad_w:i",
           [](const WindowArgs& a) {
             Halide::RDom r(0, a.kernel_w, 0, a.kernel_h);
             Expr x = detail::window_x(a, r.x), y = detail::window_y(a, r.y);
             Expr x0 = detail::first_x(a, a.w), y0 = detail::first_y(a, a.h);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) = {a.in(x0, y0, a.c, a.n), y0 * a.in_w + x0};
             Halide::FuncRef cur = acc(a.w, a.h, a.c, a.n);
             Expr v = a.in(x, y, a.c, a.n);
             Expr take = detail::pool_tap_inside(a, x, y) && detail::takes_max(v, cur[0]);
             acc(a.w, a.h, a.c, a.n) = {Halide::select(take, v, cur[0]),
                                        Halide::select(take, y * a.in_w + x, cur[1])};
             out(a.w, a.h, a.c, a.n) = {cur[0], Halide::cast(Halide::Int(64), cur[1])};
             return AccOut{acc, out};
           }),
    window("avg_pool2d", WindowKind::pool, floats,
           "kernel_h:i,kernel_w:i,stride_h:i,stride_w:i,pad_h:i,pad_w:i,count_include_pad:i",
           [](const WindowArgs& a) {
             Halide::RDom r(0, a.kernel_w, 0, a.kernel_h);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, 0);
             acc(a.w, a.h, a.c, a.n) +=
                 a.in(detail::window_x(a, r.x), detail::window_y(a, r.y), a.c, a.n);
             out(a.w, a.h, a.c, a.n) =
                 acc(a.w, a.h, a.c, a.n) / Halide::cast(a.type, detail::avg_count(a, a.w, a.h));
             return AccOut{acc, out};
           }),
    // conv2d's gradients. The input's: out(x, y, ci, n) sums, over the taps (kx, ky) and the
    // group's output channels, the gradient at the output whose window puts tap (kx, ky) on
    // (x, y) times that tap's weight: a transposed convolution (ConvTranspose2d without bias).
    window("conv2d_backward_input", WindowKind::conv_grad_input, floats,
           "stride_h:i,stride_w:i,pad_h:i,pad_w:i,dil_h:i,dil_w:i,groups:i",
           [](const WindowArgs& a) {
             Expr cout_g = a.grad_c / a.attr["groups"];
             Halide::RDom r(0, a.kernel_w, 0, a.kernel_h, 0, cout_g);
             Expr group = Halide::select(a.attr["groups"] == 1, 0, a.c / a.group_c);
             Expr xs = a.w + a.attr["pad_w"] - r.x * a.attr["dil_w"],
                  ys = a.h + a.attr["pad_h"] - r.y * a.attr["dil_h"];
             Expr sw = a.attr["stride_w"], sh = a.attr["stride_h"];
             // Taps that fall outside the gradient add nothing: they are not visited (a schedule
             // with the output point outside the taps' loops gets exact loop bounds), and every
             // gradient read is inside it. (Those between its strided points are selected away: in
             // the predicate they cost the unit-stride loop a test per tap.)
             r.where(xs >= 0 && xs < a.grad_w * sw && ys >= 0 && ys < a.grad_h * sh);
             Expr co = group * cout_g + r.z;
             // Each index lies in range, but bounds inference cannot follow the predicate or the
             // group arithmetic and would ask for larger buffers: it is told so, at no cost at run
             // time.
             Expr gx = Halide::unsafe_promise_clamped(xs / sw, 0, a.grad_w - 1),
                  gy = Halide::unsafe_promise_clamped(ys / sh, 0, a.grad_h - 1);
             Expr g = Halide::select(xs % sw == 0 && ys % sh == 0, a.grad_inside(gx, gy, co, a.n),
                                     Halide::cast(a.type, 0));
             Expr ci = Halide::unsafe_promise_clamped(a.c - group * a.group_c, 0, a.group_c - 1),
                  wco = Halide::unsafe_promise_clamped(co, 0, a.out_c - 1);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, 0);
             acc(a.w, a.h, a.c, a.n) += g * a.weight(r.x, r.y, ci, wco);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n);
             return AccOut{acc, out};
           }),
    // The weight's: out(kx, ky, ci, co) sums, over every output position and image, the gradient
    // there times the input under tap (kx, ky).
    window("conv2d_backward_weight", WindowKind::conv_grad_weight, floats,
           "stride_h:i,stride_w:i,pad_h:i,pad_w:i,dil_h:i,dil_w:i,groups:i",
           [](const WindowArgs& a) {
             Expr cin_g = a.in_c / a.attr["groups"], cout_g = a.grad_c / a.attr["groups"];
             Halide::RDom r(0, a.grad_w, 0, a.grad_h, 0, a.grad_n);
             Expr group = Halide::select(a.attr["groups"] == 1, 0, a.n / cout_g);
             Expr x = detail::tap_x(a, r.x, a.w, a.attr["dil_w"]),
                  y = detail::tap_y(a, r.y, a.h, a.attr["dil_h"]);
             Func acc("acc"), out("out");
             acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, 0);
             acc(a.w, a.h, a.c, a.n) +=
                 a.grad_inside(r.x, r.y, a.n, r.z) * a.in(x, y, group * cin_g + a.c, r.z);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n);
             return AccOut{acc, out};
           }),
    // max_pool2d's: each window's gradient goes to its maximum, where the forward's indices
    // (max_pool2d_with_indices) say it is.
    window("max_pool2d_backward", WindowKind::pool_grad_indices, floats,
           "kernel_h:i,kernel_w:i,stride_h:i,stride_w:i,pad_h:i,pad_w:i,in_w:i",
           [](const WindowArgs& a) {
             Expr here = Halide::cast(Halide::Int(64), a.h * a.in_w + a.w);
             return detail::pool_gradient(a, [&](const Expr& gw, const Expr& gh) {
               return Halide::select(a.indices(gw, gh, a.c, a.n) == here, a.grad(gw, gh, a.c, a.n),
                                     Halide::cast(a.type, 0));
             });
           }),
    // avg_pool2d's: each window's gradient, divided by its divisor, to every input it covers.
    window("avg_pool2d_backward", WindowKind::pool_grad, floats,
           "kernel_h:i,kernel_w:i,stride_h:i,stride_w:i,pad_h:i,pad_w:i,count_include_pad:i",
           [](const WindowArgs& a) {
             // A window that does not cover the point is selected away, but its divisor may be
             // zero: kept at least 1 so that no discarded value is a NaN.
             return detail::pool_gradient(a, [&](const Expr& gw, const Expr& gh) {
               return a.grad(gw, gh, a.c, a.n) /
                      Halide::cast(a.type, Halide::max(detail::avg_count(a, gw, gh), 1));
             });
           }));

}  // namespace opforge::ops
