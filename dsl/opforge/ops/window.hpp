// Window ops on NCHW images: convolution and pooling. Output extents come from the output buffer,
// which the runtime sizes from the attributes.
#pragma once
#include "opforge/dsl/op.hpp"

namespace opforge::ops {
using namespace opforge::dsl;

namespace detail {
// Input coordinates of kernel tap (rx, ry) for output (w, h).
inline Expr window_x(const WindowArgs& a, const Expr& rx, const Expr& dil = 1) {
  return a.w * a.attr["stride_w"] - a.attr["pad_w"] + rx * dil;
}
inline Expr window_y(const WindowArgs& a, const Expr& ry, const Expr& dil = 1) {
  return a.h * a.attr["stride_h"] - a.attr["pad_h"] + ry * dil;
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
             acc(a.w, a.h, a.c, a.n) = Halide::cast(a.type, -INFINITY);
             Expr cur = acc(a.w, a.h, a.c, a.n);
             acc(a.w, a.h, a.c, a.n) =
                 Halide::select(a.inside(x, y) && (v > cur || Halide::is_nan(v)), v, cur);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n);
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
             Expr x0 = detail::window_x(a, 0), y0 = detail::window_y(a, 0);
             Expr valid = (Halide::min(x0 + a.kernel_w, a.in_w) - Halide::max(x0, 0)) *
                          (Halide::min(y0 + a.kernel_h, a.in_h) - Halide::max(y0, 0));
             Expr count =
                 Halide::select(a.attr["count_include_pad"] != 0, a.kernel_w * a.kernel_h, valid);
             out(a.w, a.h, a.c, a.n) = acc(a.w, a.h, a.c, a.n) / Halide::cast(a.type, count);
             return AccOut{acc, out};
           }));

}  // namespace opforge::ops
