// Window family: NCHW convolution and pooling, and their gradients (generated window ops of their
// own: conv2d_backward_input, which is also conv_transpose2d, conv2d_backward_weight and the pools'
// backward ops). The runtime checks the geometry and sizes the output; the kernels read it from
// the output buffer.
#include <limits>

#include "autograd/record.hpp"
#include "kernels/kernel_call.hpp"

namespace opforge {
namespace {
using namespace detail;

int64_t out_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                 const char* which) {
  int64_t span = checked_add(op, "the dilated kernel extent",
                             checked_mul(op, "the dilated kernel extent", d, k - 1), 1);
  int64_t padded = checked_add(op, "the padded input", in, checked_mul(op, "the padding", 2, p));
  int64_t o = (padded - span) / s + 1;
  OPFORGE_CHECK(padded >= span && o >= 1)
      << op << ": the output " << which << " would be empty: input " << which << " " << in
      << " with padding " << p << " is smaller than the kernel extent " << span;
  return o;
}

void check_positive(const char* op, const std::array<int64_t, 2>& v, const char* what,
                    int64_t min) {
  OPFORGE_CHECK(v[0] >= min && v[1] >= min) << op << ": " << what << " must be at least " << min
                                            << ", got (" << v[0] << ", " << v[1] << ")";
}

void check_image(const char* op, const Tensor& t, const char* what, const char* layout) {
  OPFORGE_CHECK(t.defined() && t.dim() == 4)
      << op << ": " << what << " must be 4-D " << layout << ", got shape "
      << (t.defined() ? shape_str(t.shape()) : "undefined");
}

void check_shape(const char* op, const Tensor& t, const char* what, const Shape& want) {
  OPFORGE_CHECK(t.shape() == want) << op << ": " << what << " has shape " << shape_str(t.shape())
                                   << ", expected " << shape_str(want);
}

// The kernels of a window op at the dtype its inputs promote to (float32 for integers).
const KernelGroup& window_group(const OpInfo& op, DType d) {
  return op.group(std::string(dtype_name(is_floating(d) ? d : DType::Float32)));
}

// A convolution's sizes: x (N, C, H, W) * w (OC, C / groups, KH, KW) -> (N, OC, OH, OW).
struct ConvGeometry {
  int64_t N, C, H, W, OC, KH, KW, OH, OW;
  Shape out() const { return {N, OC, OH, OW}; }
};
ConvGeometry conv_geometry(const char* op, const Shape& x, const Shape& w, const Conv2dOptions& o) {
  OPFORGE_CHECK(w.size() == 4) << op
                               << ": weight must be 4-D (out_channels, in_channels/groups, kH, "
                                  "kW), got shape "
                               << shape_str(w);
  ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0};
  OPFORGE_CHECK(o.groups >= 1 && g.C % o.groups == 0 && g.OC % o.groups == 0)
      << op << ": groups=" << o.groups << " must divide both the input channels (" << g.C
      << ") and the output channels (" << g.OC << ")";
  OPFORGE_CHECK(w[1] * o.groups == g.C)
      << op << ": weight " << shape_str(w) << " expects " << w[1] * o.groups
      << " input channels (in_channels/groups = " << w[1] << ", groups = " << o.groups
      << "), input " << shape_str(x) << " has " << g.C;
  check_positive(op, o.stride, "stride", 1);
  check_positive(op, o.dilation, "dilation", 1);
  check_positive(op, o.padding, "padding", 0);
  g.OH = out_size(op, g.H, g.KH, o.stride[0], o.padding[0], o.dilation[0], "height");
  g.OW = out_size(op, g.W, g.KW, o.stride[1], o.padding[1], o.dilation[1], "width");
  return g;
}

void conv_attrs(KernelArgs& args, const OpInfo& op, const Conv2dOptions& o) {
  args.attrs(op,
             {double(o.stride[0]), double(o.stride[1]), double(o.padding[0]), double(o.padding[1]),
              double(o.dilation[0]), double(o.dilation[1]), double(o.groups)});
}

// Runs one of conv2d's gradient ops on its two inputs (in the kernel's order) into a result of
// `shape`: conv2d_backward_input (grad, weight) -> the input's shape, conv2d_backward_weight
// (input, grad) -> the weight's. The kernels read grad as zero outside it, so it may be smaller
// than the convolution's output (conv_transpose2d's output_padding).
Tensor conv_grad_kernel(const OpInfo& op, const Tensor& a_in, const Tensor& b_in,
                        const Shape& shape, const Conv2dOptions& o) {
  const KernelGroup& g = window_group(op, promote(a_in.dtype(), b_in.dtype()));
  Tensor a = a_in.to(g.in_dtype).contiguous(), b = b_in.to(g.in_dtype).contiguous();
  if (shape_numel(shape) == 0) return place_like(Tensor::empty(shape, g.out_dtype), {a, b});
  if (a.numel() == 0 || b.numel() == 0)  // an empty sum
    return place_like(Tensor::zeros(shape, g.out_dtype), {a, b});
  Tensor out = Tensor::empty(shape, g.out_dtype);
  KernelArgs args;
  args.input(view_of(a));
  args.input(view_of(b));
  conv_attrs(args, op, o);
  args.output(view_of(out));
  launch(g, extents({shape[3], shape[2], shape[1], shape[0]}), std::move(args));
  return out;
}
Tensor grad_input_kernel(const Tensor& grad, const Tensor& w, const Shape& input,
                         const Conv2dOptions& o) {
  return conv_grad_kernel(OPFORGE_OP("conv2d_backward_input"), grad, w, input, o);
}
Tensor grad_weight_kernel(const Tensor& x, const Tensor& grad, const Shape& weight,
                          const Conv2dOptions& o) {
  return conv_grad_kernel(OPFORGE_OP("conv2d_backward_weight"), x, grad, weight, o);
}

// A pool's sizes, with the stride resolved (0: the kernel size).
struct PoolGeometry {
  std::array<int64_t, 2> stride;
  Shape out;
};
// A pool's stride (0: the kernel size), its options checked.
std::array<int64_t, 2> pool_stride(const char* name, const Pool2dOptions& o) {
  auto stride = o.stride;
  for (size_t d = 0; d < 2; d++)
    if (stride[d] == 0) stride[d] = o.kernel[d];
  check_positive(name, o.kernel, "kernel", 1);
  check_positive(name, stride, "stride", 1);
  check_positive(name, o.padding, "padding", 0);
  return stride;
}

PoolGeometry pool_geometry(const char* name, const Shape& x, const Pool2dOptions& o) {
  const auto stride = pool_stride(name, o);
  OPFORGE_CHECK(o.padding[0] * 2 <= o.kernel[0] && o.padding[1] * 2 <= o.kernel[1])
      << name << ": padding must be at most half the kernel size, got padding (" << o.padding[0]
      << ", " << o.padding[1] << ") for kernel (" << o.kernel[0] << ", " << o.kernel[1] << ")";
  int64_t OH = out_size(name, x[2], o.kernel[0], stride[0], o.padding[0], 1, "height");
  int64_t OW = out_size(name, x[3], o.kernel[1], stride[1], o.padding[1], 1, "width");
  return {stride, {x[0], x[1], OH, OW}};
}

PoolGeometry pool_geometry(const char* name, const Tensor& x, const Pool2dOptions& o) {
  check_image(name, x, "input", "NCHW");
  return pool_geometry(name, x.shape(), o);
}

// The attributes every pool kernel starts with.
AttrValues pool_attrs(const Pool2dOptions& o, const PoolGeometry& geo) {
  return {double(o.kernel[0]),   double(o.kernel[1]),  double(geo.stride[0]),
          double(geo.stride[1]), double(o.padding[0]), double(o.padding[1])};
}

// Runs a pool (grad undefined) or avg_pool2d's gradient (the result has x's shape).
Tensor pool_kernel(const char* name, const Tensor& x_in, const Tensor& grad_in,
                   const Pool2dOptions& o, bool avg) {
  const OpInfo& op = op_info(name);
  PoolGeometry geo = pool_geometry(name, x_in, o);
  bool backward = grad_in.defined();
  if (backward) check_shape(name, grad_in, "the gradient", geo.out);
  const KernelGroup& g = window_group(op, x_in.dtype());
  Tensor x = x_in.to(g.in_dtype).contiguous();
  Shape out_shape = backward ? x.shape() : geo.out;
  Tensor out = Tensor::empty(out_shape, g.out_dtype);
  if (out.numel() == 0) return place_like(out, {x});
  KernelArgs args;
  args.input(view_of(x));
  Tensor grad;
  if (backward) {
    grad = grad_in.to(g.in_dtype).contiguous();
    args.input(view_of(grad));
  }
  AttrValues attrs = pool_attrs(o, geo);
  if (avg) attrs.push_back(o.count_include_pad ? 1 : 0);
  args.attrs(op, attrs);
  args.output(view_of(out));
  launch(g, extents({out_shape[3], out_shape[2], out_shape[1], out_shape[0]}), std::move(args));
  return out;
}

// The kernels count a window's place in its input plane in 32 bits.
void check_plane(const char* name, const Tensor& x) {
  OPFORGE_CHECK(x.size(2) <= std::numeric_limits<int32_t>::max() / std::max<int64_t>(x.size(3), 1))
      << name << ": an input plane of " << x.size(2) << " x " << x.size(3)
      << " has more than 2^31 - 1 elements, which the indices of its windows cannot count";
}

// max_pool2d_with_indices' kernel: the windows' maxima and their indices (no recording); `name`
// is the op that errors name.
std::pair<Tensor, Tensor> max_pool_indices_kernel(const char* name, const Tensor& x_in,
                                                  const Pool2dOptions& o) {
  const OpInfo& op = OPFORGE_OP("max_pool2d_with_indices");
  PoolGeometry geo = pool_geometry(name, x_in, o);
  check_plane(name, x_in);
  const KernelGroup& g = window_group(op, x_in.dtype());
  Tensor x = x_in.to(g.in_dtype).contiguous();
  Tensor values = Tensor::empty(geo.out, g.out_dtype),
         indices = Tensor::empty(geo.out, DType::Int64);
  if (values.numel() == 0) return {place_like(values, {x}), place_like(indices, {x})};
  KernelArgs args;
  args.input(view_of(x));
  args.attrs(op, pool_attrs(o, geo));
  args.output(view_of(values));
  args.output(view_of(indices));
  launch(g, extents({geo.out[3], geo.out[2], geo.out[1], geo.out[0]}), std::move(args));
  return {values, indices};
}

// max_pool2d's gradient from the windows' indices: an input of x_shape, each window's gradient at
// its maximum.
Tensor max_pool_grad_kernel(const Tensor& grad_in, const Tensor& indices, const Shape& x_shape,
                            const Pool2dOptions& o) {
  const OpInfo& op = OPFORGE_OP("max_pool2d_backward");
  PoolGeometry geo = pool_geometry("max_pool2d_backward", x_shape, o);
  check_shape("max_pool2d_backward", grad_in, "the gradient", geo.out);
  check_shape("max_pool2d_backward", indices, "the indices", geo.out);
  const KernelGroup& g = window_group(op, grad_in.dtype());
  Tensor out = Tensor::empty(x_shape, g.out_dtype);
  if (out.numel() == 0) return place_like(out, {grad_in});
  Tensor grad = grad_in.to(g.in_dtype).contiguous(), idx = indices.contiguous();
  KernelArgs args;
  args.input(view_of(grad));
  args.input(view_of(idx));
  AttrValues attrs = pool_attrs(o, geo);
  attrs.push_back(double(x_shape[3]));
  args.attrs(op, attrs);
  args.output(view_of(out));
  launch(g, extents({x_shape[3], x_shape[2], x_shape[1], x_shape[0]}), std::move(args));
  return out;
}

// The gradients an op's backward needs: an Error if one of them asks for a gradient itself (a
// second derivative, which these ops do not record).
void check_first_order(const char* op, std::initializer_list<Tensor> in) {
  autograd::check_no_grad_needed(op, std::span<const Tensor>(in.begin(), in.size()),
                                 "second derivatives of window ops are not recorded");
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
              const Conv2dOptions& o) {
  if (autograd::wants_grad({x_in, w_in, bias_in})) {
    std::vector<Tensor> in = {x_in, w_in};
    if (bias_in.defined()) in.push_back(bias_in);
    return autograd::differentiable(
        "conv2d", std::span<const Tensor>(in), [&] { return conv2d(x_in, w_in, bias_in, o); },
        [&](const Tensor&) {
          // Only the gradients some input asks for: the first layer's input (the data) needs
          // none, and its gradient would be a whole transposed convolution.
          bool need_x = x_in.requires_grad(), need_w = w_in.requires_grad(),
               need_b = bias_in.defined() && bias_in.requires_grad(), has_b = bias_in.defined();
          return [sx = need_w ? autograd::SavedTensor(x_in) : autograd::SavedTensor(),
                  sw = need_x ? autograd::SavedTensor(w_in) : autograd::SavedTensor(),
                  xs = x_in.shape(), ws = w_in.shape(), xd = x_in.dtype(), wd = w_in.dtype(),
                  bd = has_b ? bias_in.dtype() : DType::Float32, o, need_x, need_w, need_b,
                  has_b](const std::vector<Tensor>& g) {
            std::vector<Tensor> grads(has_b ? 3 : 2);
            if (need_x) grads[0] = grad_input_kernel(g[0], sw.unpack("conv2d"), xs, o).to(xd);
            if (need_w) grads[1] = grad_weight_kernel(sx.unpack("conv2d"), g[0], ws, o).to(wd);
            if (need_b) grads[2] = sum(g[0], {0, 2, 3}).to(bd);
            return grads;
          };
        });
  }
  const OpInfo& op = OPFORGE_OP("conv2d");
  check_image("conv2d", x_in, "input", "NCHW");
  OPFORGE_CHECK(w_in.defined()) << "conv2d: the weight is undefined";
  ConvGeometry geo = conv_geometry("conv2d", x_in.shape(), w_in.shape(), o);
  const KernelGroup& g = window_group(op, promote(x_in.dtype(), w_in.dtype()));
  Tensor x = x_in.to(g.in_dtype).contiguous(), w = w_in.to(g.in_dtype).contiguous();
  Tensor bias =
      bias_in.defined() ? bias_in.to(g.in_dtype).contiguous() : Tensor::zeros({geo.OC}, g.in_dtype);
  OPFORGE_CHECK(bias.dim() == 1 && bias.size(0) == geo.OC)
      << "conv2d: bias has shape " << shape_str(bias.shape()) << ", expected [" << geo.OC << "]";
  Tensor out = Tensor::empty(geo.out(), g.out_dtype);
  if (out.numel() == 0) return place_like(out, {x});
  KernelArgs args;
  args.input(view_of(x));
  args.input(view_of(w));
  args.input(view_of(bias));
  conv_attrs(args, op, o);
  args.output(view_of(out));
  launch(g, extents({geo.OW, geo.OH, geo.OC, geo.N}), std::move(args));
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& o) {
  const char* op = "conv2d_backward_input";
  check_first_order(op, {grad, weight});
  check_image(op, grad, "the gradient", "NCHW");
  OPFORGE_CHECK(weight.defined()) << op << ": the weight is undefined";
  OPFORGE_CHECK(input_shape.size() == 4)
      << op << ": the input shape must be 4-D NCHW, got " << shape_str(input_shape);
  ConvGeometry geo = conv_geometry(op, input_shape, weight.shape(), o);
  check_shape(op, grad, "the gradient", geo.out());
  return grad_input_kernel(grad, weight, input_shape, o);
}

Tensor conv2d_backward_weight(const Tensor& x, const Tensor& grad, const Shape& weight_shape,
                              const Conv2dOptions& o) {
  const char* op = "conv2d_backward_weight";
  check_first_order(op, {x, grad});
  check_image(op, x, "input", "NCHW");
  check_image(op, grad, "the gradient", "NCHW");
  ConvGeometry geo = conv_geometry(op, x.shape(), weight_shape, o);
  check_shape(op, grad, "the gradient", geo.out());
  return grad_weight_kernel(x, grad, weight_shape, o);
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dOptions& o) {
  const char* op = "conv_transpose2d";
  check_image(op, x, "input", "NCHW");
  OPFORGE_CHECK(weight.defined() && weight.dim() == 4)
      << op << ": weight must be 4-D (in_channels, out_channels/groups, kH, kW), got shape "
      << (weight.defined() ? shape_str(weight.shape()) : "undefined");
  OPFORGE_CHECK(o.groups >= 1 && weight.size(0) == x.size(1) && x.size(1) % o.groups == 0)
      << op << ": weight " << shape_str(weight.shape()) << " takes " << weight.size(0)
      << " input channels in groups of " << o.groups << ", input " << shape_str(x.shape())
      << " has " << x.size(1);
  check_positive(op, o.stride, "stride", 1);
  check_positive(op, o.dilation, "dilation", 1);
  check_positive(op, o.padding, "padding", 0);
  check_positive(op, o.output_padding, "output_padding", 0);
  for (int d = 0; d < 2; d++)
    OPFORGE_CHECK(o.output_padding[size_t(d)] < o.stride[size_t(d)])
        << op << ": output_padding (" << o.output_padding[0] << ", " << o.output_padding[1]
        << ") must be smaller than the stride (" << o.stride[0] << ", " << o.stride[1] << ")";
  // The convolution whose input gradient this is maps (N, C_out, H, W) to x's shape.
  Shape out_shape = {x.size(0), weight.size(1) * o.groups, 0, 0};
  for (int d = 0; d < 2; d++) {
    auto s = size_t(d);
    int64_t k = weight.size(2 + d), in = x.size(2 + d);
    int64_t span = checked_mul(op, "the dilated kernel extent", o.dilation[s], k - 1);
    int64_t grown = checked_mul(op, "the output size", in - 1, o.stride[s]);
    int64_t size = checked_add(op, "the output size", grown, span + o.output_padding[s] + 1) -
                   2 * o.padding[s];
    OPFORGE_CHECK(size >= 1) << op << ": the output would be empty (size " << size << " along "
                             << (d == 0 ? "height" : "width") << ")";
    out_shape[size_t(2 + d)] = size;
  }
  Tensor out = autograd::differentiable(
      op, {x, weight}, [&] { return grad_input_kernel(x, weight, out_shape, o); },
      [&](const Tensor&) {
        bool need_x = x.requires_grad(), need_w = weight.requires_grad();
        return [sx = need_w ? autograd::SavedTensor(x) : autograd::SavedTensor(),
                sw = need_x ? autograd::SavedTensor(weight) : autograd::SavedTensor(), o,
                xd = x.dtype(), wd = weight.dtype(), ws = weight.shape(), need_x,
                need_w](const std::vector<Tensor>& g) {
          std::vector<Tensor> grads(2);
          if (need_x) grads[0] = conv2d(g[0], sw.unpack("conv_transpose2d"), {}, o).to(xd);
          if (need_w)
            grads[1] = grad_weight_kernel(g[0], sx.unpack("conv_transpose2d"), ws, o).to(wd);
          return grads;
        };
      });
  if (!bias.defined()) return out;
  OPFORGE_CHECK(bias.dim() == 1 && bias.size(0) == out_shape[1])
      << op << ": bias has shape " << shape_str(bias.shape()) << ", expected [" << out_shape[1]
      << "]";
  return add(out, bias.reshape({1, out_shape[1], 1, 1}));
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  if (autograd::wants_grad({x})) return max_pool2d_with_indices(x, o).first;
  return pool_kernel("max_pool2d", x, {}, o, false);
}
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& o) {
  Tensor indices;
  Tensor values = autograd::differentiable(
      "max_pool2d", {x},
      [&] {
        auto [v, i] = max_pool_indices_kernel("max_pool2d_with_indices", x, o);
        indices = i;
        return v;
      },
      [&](const Tensor&) {
        return [si = autograd::SavedTensor(indices), xs = x.shape(), xd = x.dtype(),
                o](const std::vector<Tensor>& g) {
          Tensor i = si.unpack("max_pool2d");
          return std::vector<Tensor>{max_pool_grad_kernel(g[0], i, xs, o).to(xd)};
        };
      });
  return {values, indices};
}
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  return autograd::differentiable(
      "avg_pool2d", {x}, [&] { return pool_kernel("avg_pool2d", x, {}, o, true); },
      [&](const Tensor&) {
        return [sx = autograd::SavedTensor(x), o](const std::vector<Tensor>& g) {
          Tensor x = sx.unpack("avg_pool2d");
          return std::vector<Tensor>{
              pool_kernel("avg_pool2d_backward", x, g[0], o, true).to(x.dtype())};
        };
      });
}
Tensor max_pool2d_backward(const Tensor& x, const Tensor& grad, const Pool2dOptions& o) {
  const char* name = "max_pool2d_backward";
  check_first_order(name, {x, grad});
  check_image(name, grad, "the gradient", "NCHW");
  Tensor indices = max_pool_indices_kernel(name, x, o).second;
  return max_pool_grad_kernel(grad, indices, x.shape(), o);
}
Tensor avg_pool2d_backward(const Tensor& x, const Tensor& grad, const Pool2dOptions& o) {
  check_first_order("avg_pool2d_backward", {x, grad});
  check_image("avg_pool2d_backward", grad, "the gradient", "NCHW");
  return pool_kernel("avg_pool2d_backward", x, grad, o, true);
}

Tensor max_unpool2d(const Tensor& x, const Tensor& indices, const Pool2dOptions& o,
                    std::optional<std::array<int64_t, 2>> output_size) {
  const char* op = "max_unpool2d";
  check_image(op, x, "input", "NCHW");
  OPFORGE_CHECK(indices.defined() && indices.dtype() == DType::Int64)
      << op << ": the indices must be int64 (as max_pool2d_with_indices gives them), got "
      << (indices.defined() ? std::string(dtype_name(indices.dtype())) : "undefined");
  check_shape(op, indices, "the indices", x.shape());
  const auto stride = pool_stride(op, o);
  std::array<int64_t, 2> size{};
  for (size_t d = 0; d < 2; d++) {
    const char* which = d == 0 ? "height" : "width";
    int64_t grown = checked_mul(op, "the output size", x.size(int(2 + d)) - 1, stride[d]);
    int64_t full = checked_add(op, "the output size", grown, o.kernel[d]) - 2 * o.padding[d];
    size[d] = output_size ? (*output_size)[d] : full;
    OPFORGE_CHECK(size[d] > full - stride[d] && size[d] < full + stride[d] && size[d] >= 1)
        << op << ": output " << which << " " << size[d] << " must lie within a stride ("
        << stride[d] << ") of " << full << ", what the pool's options give";
  }
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t plane = checked_mul(op, "the output plane", size[0], size[1]);
  const Shape out_shape{N, C, size[0], size[1]};
  if (x.numel() == 0) return place_like(Tensor::zeros(out_shape, x.dtype()), {x});
  // PyTorch refuses an index outside its plane: it would land in another image or channel.
  const double lo = min(indices).to_double_vector()[0], hi = max(indices).to_double_vector()[0];
  OPFORGE_CHECK(lo >= 0 && hi < double(plane))
      << op << ": found an invalid index " << int64_t(lo < 0 ? lo : hi) << ", expected 0 to "
      << plane - 1 << " (output planes of " << size[0] << " x " << size[1] << ")";
  // Each plane's indices made indices into the whole output, then one index_add.
  const int64_t planes = N * C;
  Tensor first = Tensor::arange(0, double(planes) * double(plane), double(plane), DType::Int64);
  Tensor at = add(indices.reshape({planes, -1}), first.reshape({planes, 1})).reshape({-1});
  Tensor zeros = place_like(Tensor::zeros({planes * plane}, x.dtype()), {x});
  return index_add(zeros, 0, at, x.reshape({-1})).reshape(out_shape);
}

}  // namespace opforge
