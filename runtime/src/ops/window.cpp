// Window family: NCHW convolution and pooling. The runtime checks the geometry and sizes the
// output; the kernels read it from the output buffer.
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

Tensor pool(const char* name, const Tensor& x_in, const Pool2dOptions& o, bool avg) {
  const OpInfo& op = op_info(name);
  OPFORGE_CHECK(x_in.defined() && x_in.dim() == 4)
      << name << ": input must be 4-D NCHW, got shape "
      << (x_in.defined() ? shape_str(x_in.shape()) : "undefined");
  const KernelGroup& g =
      op.group(std::string(dtype_name(is_floating(x_in.dtype()) ? x_in.dtype() : DType::Float32)));
  Tensor x = x_in.to(g.in_dtype).contiguous();
  auto stride = o.stride;
  if (stride[0] == 0) stride[0] = o.kernel[0];
  if (stride[1] == 0) stride[1] = o.kernel[1];
  check_positive(name, o.kernel, "kernel", 1);
  check_positive(name, stride, "stride", 1);
  check_positive(name, o.padding, "padding", 0);
  OPFORGE_CHECK(o.padding[0] * 2 <= o.kernel[0] && o.padding[1] * 2 <= o.kernel[1])
      << name << ": padding must be at most half the kernel size, got padding (" << o.padding[0]
      << ", " << o.padding[1] << ") for kernel (" << o.kernel[0] << ", " << o.kernel[1] << ")";
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  int64_t OH = out_size(name, H, o.kernel[0], stride[0], o.padding[0], 1, "height");
  int64_t OW = out_size(name, W, o.kernel[1], stride[1], o.padding[1], 1, "width");
  Tensor out = Tensor::empty({N, C, OH, OW}, g.out_dtype);
  if (out.numel() == 0) return place_like(out, {x});
  KernelArgs args;
  args.input(view_of(x));
  AttrValues attrs = {double(o.kernel[0]), double(o.kernel[1]),  double(stride[0]),
                      double(stride[1]),   double(o.padding[0]), double(o.padding[1])};
  if (avg) attrs.push_back(o.count_include_pad ? 1 : 0);
  args.attrs(op, attrs);
  args.output(view_of(out));
  launch(g, extents({OW, OH, C, N}), std::move(args));
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
              const Conv2dOptions& o) {
  static const OpInfo& op = op_info("conv2d");
  {
    const Tensor in[] = {x_in, w_in, bias_in};
    autograd::check_no_grad_needed("conv2d", in,
                                   "conv2d_backward_input and conv2d_backward_weight are not "
                                   "generated yet");
  }
  OPFORGE_CHECK(x_in.defined() && x_in.dim() == 4)
      << "conv2d: input must be 4-D NCHW, got shape "
      << (x_in.defined() ? shape_str(x_in.shape()) : "undefined");
  OPFORGE_CHECK(w_in.defined() && w_in.dim() == 4)
      << "conv2d: weight must be 4-D (out_channels, in_channels/groups, kH, kW), got shape "
      << (w_in.defined() ? shape_str(w_in.shape()) : "undefined");
  DType d = promote(x_in.dtype(), w_in.dtype());
  const KernelGroup& g = op.group(std::string(dtype_name(is_floating(d) ? d : DType::Float32)));
  Tensor x = x_in.to(g.in_dtype).contiguous(), w = w_in.to(g.in_dtype).contiguous();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  int64_t OC = w.size(0), KH = w.size(2), KW = w.size(3);
  OPFORGE_CHECK(o.groups >= 1 && C % o.groups == 0 && OC % o.groups == 0)
      << "conv2d: groups=" << o.groups << " must divide both the input channels (" << C
      << ") and the output channels (" << OC << ")";
  OPFORGE_CHECK(w.size(1) * o.groups == C)
      << "conv2d: weight " << shape_str(w.shape()) << " expects " << w.size(1) * o.groups
      << " input channels (in_channels/groups = " << w.size(1) << ", groups = " << o.groups
      << "), input " << shape_str(x.shape()) << " has " << C;
  check_positive("conv2d", o.stride, "stride", 1);
  check_positive("conv2d", o.dilation, "dilation", 1);
  check_positive("conv2d", o.padding, "padding", 0);
  int64_t OH = out_size("conv2d", H, KH, o.stride[0], o.padding[0], o.dilation[0], "height");
  int64_t OW = out_size("conv2d", W, KW, o.stride[1], o.padding[1], o.dilation[1], "width");
  Tensor bias =
      bias_in.defined() ? bias_in.to(g.in_dtype).contiguous() : Tensor::zeros({OC}, g.in_dtype);
  OPFORGE_CHECK(bias.dim() == 1 && bias.size(0) == OC)
      << "conv2d: bias has shape " << shape_str(bias.shape()) << ", expected [" << OC << "]";
  Tensor out = Tensor::empty({N, OC, OH, OW}, g.out_dtype);
  if (out.numel() == 0) return place_like(out, {x});
  KernelArgs args;
  args.input(view_of(x));
  args.input(view_of(w));
  args.input(view_of(bias));
  args.attrs(op,
             {double(o.stride[0]), double(o.stride[1]), double(o.padding[0]), double(o.padding[1]),
              double(o.dilation[0]), double(o.dilation[1]), double(o.groups)});
  args.output(view_of(out));
  launch(g, extents({OW, OH, OC, N}), std::move(args));
  return out;
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  autograd::check_no_grad_needed("max_pool2d", std::span<const Tensor>(&x, 1),
                                 "its backward kernel is not generated yet");
  return pool("max_pool2d", x, o, false);
}
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  autograd::check_no_grad_needed("avg_pool2d", std::span<const Tensor>(&x, 1),
                                 "its backward kernel is not generated yet");
  return pool("avg_pool2d", x, o, true);
}

}  // namespace opforge
