// Reduction family: any set of axes becomes the canonical (inner, reduced, outer) view, permuting
// (and copying) only when the reduced axes are not adjacent.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "autograd/record.hpp"
#include "kernels/kernel_call.hpp"
#include "ops/reduction_call.hpp"

namespace opforge {
namespace {
using namespace detail;

constexpr int kNormalize = 1;         // ReductionKind::normalize in the DSL
constexpr int kPerChannel = 2;        // ReductionKind::per_channel
constexpr int kChannelNormalize = 3;  // ReductionKind::channel_normalize

std::vector<int> normalize_axes(const char* op, std::vector<int> axes, int rank) {
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (auto& a : axes) a = wrap_axis(op, a, rank);
  std::sort(axes.begin(), axes.end());
  for (size_t i = 1; i < axes.size(); i++)
    OPFORGE_CHECK(axes[i] != axes[i - 1])
        << op << ": axis " << axes[i] << " appears more than once";
  return axes;
}

// Results of reducing over nothing, where the op has an identity (NumPy's values).
bool empty_reduction_value(const std::string& op, double& v) {
  if (op == "sum")
    v = 0;
  else if (op == "prod")
    v = 1;
  else if (op == "logsumexp")
    v = -std::numeric_limits<double>::infinity();
  else if (op == "mean" || op == "var")
    v = std::numeric_limits<double>::quiet_NaN();
  else
    return false;
  return true;
}

const KernelGroup& group_for(const OpInfo& op, DType t) {
  if (const KernelGroup* g = op.find_group(std::string(dtype_name(t)))) return *g;
  // bool counts: sum(bool) is an int64 count, as in NumPy and PyTorch.
  if (t == DType::Bool)
    if (const KernelGroup* g = op.find_group("int64")) return *g;
  if (!is_floating(t))
    if (const KernelGroup* g = op.find_group("float32")) return *g;
  return op.group(std::string(dtype_name(t)));
}

}  // namespace

Tensor detail::run_reduction(const OpInfo& op, Tensor x, std::vector<int> axes, bool keepdims,
                             const AttrValues& attrs, const std::vector<Tensor>& extra,
                             std::vector<Tensor> like) {
  const char* name = op.name.c_str();
  OPFORGE_CHECK(op.family == "reduction")
      << op.name << " is a " << op.family << " op, not a reduction";
  OPFORGE_CHECK(op.flags != kPerChannel && op.flags != kChannelNormalize)
      << op.name << " computes per-channel results for normalisation; call "
      << "opforge::batch_norm or opforge::layer_norm";
  OPFORGE_CHECK(x.defined()) << name << ": input is undefined";
  const KernelGroup& g = group_for(op, x.dtype());
  bool normalize = op.flags == kNormalize;
  OPFORGE_CHECK(int(extra.size() + like.size()) + 1 == op.num_inputs)
      << name << ": expected " << op.num_inputs - 1 << " more input(s), got "
      << extra.size() + like.size();
  for (const Tensor& t : like)
    OPFORGE_CHECK(t.defined() && t.shape() == x.shape())
        << name << ": an input has shape " << (t.defined() ? shape_str(t.shape()) : "undefined")
        << ", expected the first input's " << shape_str(x.shape());
  // x and the inputs of its shape take the same way to the canonical view.
  auto each = [&](auto&& f) {
    x = f(x);
    for (Tensor& t : like) t = f(t);
  };
  each([&](const Tensor& t) { return t.dtype() == g.in_dtype ? t : cast(t, g.in_dtype); });

  bool scalar_in = x.dim() == 0;
  if (scalar_in) each([](const Tensor& t) { return t.reshape({1}); });
  int rank = x.dim();
  axes = normalize_axes(name, axes, rank);
  Shape out_shape;
  if (normalize) {
    if (!scalar_in) out_shape = x.shape();
  } else if (!scalar_in) {
    for (int d = 0; d < rank; d++) {
      if (!std::binary_search(axes.begin(), axes.end(), d))
        out_shape.push_back(x.shape()[d]);
      else if (keepdims)
        out_shape.push_back(1);
    }
  }
  // Axes that are not adjacent are moved last; a normalize op's result is moved back (`back`).
  std::vector<int> back;
  if (axes.back() - axes.front() + 1 != int(axes.size())) {
    std::vector<int> perm;
    for (int d = 0; d < rank; d++)
      if (!std::binary_search(axes.begin(), axes.end(), d)) perm.push_back(d);
    int first = int(perm.size());
    perm.insert(perm.end(), axes.begin(), axes.end());
    each([&](const Tensor& t) { return t.permute(perm); });
    for (size_t i = 0; i < axes.size(); i++) axes[i] = first + int(i);
    if (normalize) {
      out_shape = x.shape();
      back.resize(perm.size());
      for (size_t i = 0; i < perm.size(); i++) back[size_t(perm[i])] = int(i);
    }
  }
  auto result = [&](const Tensor& t) { return back.empty() ? t : t.permute(back); };
  each([](const Tensor& t) { return t.contiguous(); });
  int64_t outer = 1, reduced = 1, inner = 1;
  for (int d = 0; d < rank; d++) {
    if (d < axes.front())
      outer *= x.shape()[d];
    else if (d <= axes.back())
      reduced *= x.shape()[d];
    else
      inner *= x.shape()[d];
  }
  Tensor out = Tensor::empty(out_shape, g.out_dtype);
  if (out.numel() == 0) return result(place_like(out, {x}));
  if (reduced == 0) {
    double v;
    OPFORGE_CHECK(empty_reduction_value(op.name, v))
        << name << ": cannot reduce over an empty axis (size 0): the op has no identity value";
    return result(place_like(Tensor::full(out_shape, v, g.out_dtype), {x}));
  }
  KernelArgs args;
  args.input(dense_view(x, {inner, reduced, outer}));
  for (const Tensor& t : like) args.input(dense_view(t, {inner, reduced, outer}));
  for (size_t e = 0; e < extra.size(); e++) {
    OPFORGE_CHECK(extra[e].numel() == reduced)
        << name << ": extra input " << e << " has " << extra[e].numel() << " elements, expected "
        << reduced;
    Tensor t = extra[e].to(g.in_dtype).contiguous();
    args.input(dense_view(t, {reduced}));
  }
  args.attrs(op, attrs);
  args.output(normalize ? dense_view(out, {inner, reduced, outer})
                        : dense_view(out, {inner, outer}));
  launch(g, extents({inner, reduced, outer}), std::move(args));
  return result(out);
}

std::vector<Tensor> detail::run_per_channel(const OpInfo& op, const Tensor& x,
                                            const std::vector<Tensor>& like,
                                            const std::vector<Tensor>& extra,
                                            const AttrValues& attrs) {
  const bool normalizes = op.flags == kChannelNormalize;
  OPFORGE_CHECK(op.flags == kPerChannel || normalizes)
      << op.name << " is not a per-channel reduction";
  OPFORGE_CHECK(x.defined() && x.dim() >= 2) << op.name << ": expected an (N, C, ...) input, got "
                                             << (x.defined() ? shape_str(x.shape()) : "undefined");
  const KernelGroup& g = op.group(std::string(dtype_name(x.dtype())));
  // (inner, C, N): the dims after C, the channels, the batch.
  int64_t inner = 1, channels = x.size(1), outer = x.size(0);
  for (int d = 2; d < x.dim(); d++) inner *= x.size(d);
  std::vector<Tensor> out;
  if (normalizes) out.push_back(Tensor::empty(x.shape(), g.out_dtype));
  const size_t first_channel = out.size();
  for (int j = int(first_channel); j < op.num_outputs; j++)
    out.push_back(Tensor::empty({channels}, g.out_dtype));
  if (channels == 0 || inner == 0 || outer == 0) {
    // Sums over nothing are zero.
    for (size_t j = first_channel; j < out.size(); j++)
      out[j] = Tensor::zeros({channels}, g.out_dtype);
    for (Tensor& t : out) t = place_like(t, {x});
    return out;
  }
  KernelArgs args;
  args.input(dense_view(x.contiguous(), {inner, channels, outer}));
  for (const Tensor& t : like) {
    OPFORGE_CHECK(t.defined() && t.shape() == x.shape())
        << op.name << ": an input has shape " << (t.defined() ? shape_str(t.shape()) : "undefined")
        << ", expected the first input's " << shape_str(x.shape());
    args.input(dense_view(t.to(g.in_dtype).contiguous(), {inner, channels, outer}));
  }
  // Each extra input whole: its length is the caller's to check against what the op's definition
  // indexes it by (the channels, or a row's elements or the rows on layer_norm's views).
  for (const Tensor& t : extra) args.input(dense_view(t.to(g.in_dtype).contiguous(), {t.numel()}));
  args.attrs(op, attrs);
  if (normalizes) args.output(dense_view(out[0], {inner, channels, outer}));
  for (size_t j = first_channel; j < out.size(); j++) args.output(dense_view(out[j], {channels}));
  launch(g, extents({inner, channels, outer}), std::move(args));
  return out;
}

namespace {

Tensor reduce_named(const OpInfo& op, const Tensor& x, const std::vector<int>& axes, bool keepdims,
                    const AttrValues& attrs = {}) {
  return run_reduction(op, x, axes, keepdims, attrs, {});
}

Tensor arg_reduce(const OpInfo& op, const Tensor& x, std::optional<int> axis, bool keepdims) {
  OPFORGE_CHECK(x.defined()) << op.name << ": input is undefined";
  if (axis) return reduce_named(op, x, {*axis}, keepdims);
  Tensor r = reduce_named(op, x.reshape({-1}), {0}, false);
  return keepdims ? r.reshape(Shape(size_t(x.dim()), 1)) : r;
}

// t (a reduction's result or gradient) with x's rank: the reduced dims kept as size 1, so that it
// broadcasts back over x.
Tensor kept(const Tensor& t, const Shape& x_shape, const std::vector<int>& axes, bool keepdims) {
  if (keepdims) return t;
  Shape s = x_shape;
  for (int a : axes) s[size_t(a)] = 1;
  return t.reshape(s);
}

// What a reduction's gradient needs saved: its input, its result (neither, for sum and mean).
enum Saves { kNone = 0, kInput = 1, kResult = 2 };

// A reduction that records grad(x, y, g) -> x's gradient, where y (the result, if saved) and g
// (the result's gradient) have x's rank with the reduced dims kept as size 1, and x is the input
// if saved.
template <class Grad>
Tensor reduce_recorded(const OpInfo& op, const Tensor& x, const std::vector<int>& axes_in,
                       bool keepdims, const AttrValues& attrs, int saves, Grad grad) {
  return autograd::differentiable(
      op.name, {x}, [&] { return reduce_named(op, x, axes_in, keepdims, attrs); },
      [&](const Tensor& y) {
        std::vector<int> axes = normalize_axes(op.name.c_str(), axes_in, x.dim());
        if (x.dim() == 0) axes.clear();  // a 0-d input's axis 0 is itself: nothing is reduced
        autograd::SavedTensor sx = saves & kInput ? x : Tensor(),
                              sy = saves & kResult ? y : Tensor();
        return [name = op.name, sx, sy, axes, keepdims, shape = x.shape(),
                grad](const std::vector<Tensor>& g) {
          Tensor xv = sx.unpack(name), yv = sy.unpack(name);
          if (yv.defined()) yv = kept(yv, shape, axes, keepdims);
          return std::vector<Tensor>{grad(xv, yv, kept(g[0], shape, axes, keepdims), shape, axes)};
        };
      });
}

// The number of elements each result element reduced, as a double.
double reduced_count(const Shape& shape, const std::vector<int>& axes) {
  double n = 1;
  for (int a : axes) n *= double(shape[size_t(a)]);
  return n;
}

// A reduction's gradient by its generated backward op (a normalize op reading x and the result's
// gradient expanded to x's shape), as reduce_recorded's grad.
auto by_backward_op(const char* name, AttrValues attrs = {}) {
  return [name, attrs](const Tensor& x, const Tensor&, const Tensor& g, const Shape& shape,
                       const std::vector<int>& axes) {
    return run_reduction(op_info(std::string(name)), x, axes, true, attrs, {}, {g.expand(shape)});
  };
}

}  // namespace

Tensor reduction(const std::string& op, const Tensor& x, std::vector<int> axes, bool keepdims,
                 const AttrValues& attrs, const std::vector<Tensor>& extra) {
  autograd::check_no_grad_needed(op, std::span<const Tensor>(&x, 1),
                                 "reduction() by name records no gradient; call the op's own "
                                 "function (sum, mean, softmax, ...)");
  return run_reduction(op_info(op), x, std::move(axes), keepdims, attrs, extra);
}

Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(OPFORGE_OP("sum"), x, axes, keepdims, {}, kNone,
                         [](const Tensor&, const Tensor&, const Tensor& g, const Shape& shape,
                            const std::vector<int>&) { return g.expand(shape); });
}
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(
      OPFORGE_OP("mean"), x, axes, keepdims, {}, kNone,
      [](const Tensor&, const Tensor&, const Tensor& g, const Shape& shape,
         const std::vector<int>& ax) { return div(g, reduced_count(shape, ax)).expand(shape); });
}
Tensor prod(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(OPFORGE_OP("prod"), x, axes, keepdims, {}, kInput,
                         by_backward_op("prod_backward"));
}
Tensor max(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(OPFORGE_OP("max"), x, axes, keepdims, {}, kInput,
                         by_backward_op("max_backward"));
}
Tensor min(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(OPFORGE_OP("min"), x, axes, keepdims, {}, kInput,
                         by_backward_op("min_backward"));
}
Tensor logsumexp(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_recorded(OPFORGE_OP("logsumexp"), x, axes, keepdims, {}, kInput,
                         by_backward_op("logsumexp_backward"));
}
Tensor var(const Tensor& x, const std::vector<int>& axes, bool keepdims, double ddof) {
  return reduce_recorded(OPFORGE_OP("var"), x, axes, keepdims, {ddof}, kInput,
                         by_backward_op("var_backward", {ddof}));
}
Tensor argmax(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce(OPFORGE_OP("argmax"), x, axis, keepdims);
}
Tensor argmin(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce(OPFORGE_OP("argmin"), x, axis, keepdims);
}
Tensor softmax(const Tensor& x, int axis) {
  return reduce_recorded(OPFORGE_OP("softmax"), x, {axis}, true, {}, kResult,
                         [](const Tensor&, const Tensor& y, const Tensor& g, const Shape&,
                            const std::vector<int>& ax) {
                           return run_reduction(OPFORGE_OP("softmax_backward"), y, ax, true, {}, {},
                                                {g});
                         });
}
Tensor log_softmax(const Tensor& x, int axis) {
  return reduce_recorded(OPFORGE_OP("log_softmax"), x, {axis}, true, {}, kResult,
                         [](const Tensor&, const Tensor& y, const Tensor& g, const Shape&,
                            const std::vector<int>& ax) {
                           return run_reduction(OPFORGE_OP("log_softmax_backward"), y, ax, true, {},
                                                {}, {g});
                         });
}

Tensor cross_entropy(const Tensor& x, const Tensor& p) {
  OPFORGE_CHECK(x.defined() && p.defined()) << "cross_entropy: an input is undefined";
  OPFORGE_CHECK(x.dim() == 2) << "cross_entropy: expected (N, C) scores, got shape "
                              << shape_str(x.shape());
  OPFORGE_CHECK(p.shape() == x.shape())
      << "cross_entropy: target probabilities of shape " << shape_str(p.shape())
      << ", expected the scores' " << shape_str(x.shape());
  OPFORGE_CHECK(is_floating(x.dtype()) && is_floating(p.dtype()))
      << "cross_entropy: scores and target probabilities must be float32 or float64, got "
      << dtype_name(x.dtype()) << " and " << dtype_name(p.dtype());
  if (autograd::wants_grad({x, p}))
    return autograd::differentiable(
        "cross_entropy", {x, p}, [&] { return cross_entropy(x, p); },
        [&](const Tensor&) {
          return [sx = autograd::SavedTensor(x), sp = autograd::SavedTensor(p),
                  need_x = x.requires_grad(),
                  need_p = p.requires_grad()](const std::vector<Tensor>& g) {
            Tensor xv = sx.unpack("cross_entropy"), pv = sp.unpack("cross_entropy");
            // A row's loss gradient, constant along the row.
            Tensor gr = g[0].unsqueeze(1).expand(xv.shape());
            std::vector<Tensor> grads(2);
            if (need_x)
              grads[0] = run_reduction(OPFORGE_OP("cross_entropy_backward"), xv, {1}, true, {}, {},
                                       {pv, gr})
                             .to(xv.dtype());
            if (need_p) grads[1] = mul(neg(log_softmax(xv, 1)), gr).to(pv.dtype());
            return grads;
          };
        });
  return run_reduction(OPFORGE_OP("cross_entropy"), x, {1}, false, {}, {}, {p});
}

namespace {
// layer_norm's kernels see x (rows, D), D the product of the normalised dims, as the row view
// (1, rows, D) (run_per_channel's (N, C, ...) with each row a channel) or as (rows, D).
struct RowsOfD {
  int64_t rows = 1, D = 1;
  RowsOfD(const Shape& x, size_t normalized_dims) {
    for (size_t i = 0; i < x.size(); i++) (i + normalized_dims < x.size() ? rows : D) *= x[i];
  }
};

// The gradients of layer_norm at x, given g (the result's gradient) and the forward's saved mean
// and rstd per row: with xhat = (x - mean) * rstd and gw = g * weight,
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), dweight = sum(g * xhat), dbias = sum(g).
// dx is one generated kernel (layer_norm_backward, row sums and result), the weight's and bias's
// another (layer_norm_backward_reduce: sums over the rows).
std::vector<Tensor> layer_norm_grads(const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, const Shape& normalized, bool need_x,
                                     bool need_w, const std::optional<Shape>& bias_shape,
                                     const Tensor& g) {
  const DType d = mean.dtype();  // the forward's: an integer x was normalised in float32
  const RowsOfD v(x.shape(), normalized.size());
  Tensor dx, dw, db;
  if (need_x)
    dx = run_per_channel(OPFORGE_OP("layer_norm_backward"), x.to(d).reshape({1, v.rows, v.D}),
                         {g.to(d).reshape({1, v.rows, v.D})}, {mean, rstd, w.reshape({v.D})}, {})[0]
             .reshape(x.shape());
  if (need_w || bias_shape) {
    std::vector<Tensor> sums =
        run_per_channel(OPFORGE_OP("layer_norm_backward_reduce"), x.to(d).reshape({v.rows, v.D}),
                        {g.to(d).reshape({v.rows, v.D})}, {mean, rstd}, {});
    dw = need_w ? sums[0].reshape(normalized) : Tensor();
    db = bias_shape ? sums[1].reshape(*bias_shape) : Tensor();
  }
  return {dx, dw, db};
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  OPFORGE_CHECK(x.defined()) << "layer_norm: input is undefined";
  int k = int(normalized_shape.size());
  OPFORGE_CHECK(k >= 1 && k <= x.dim())
      << "layer_norm: normalized_shape " << shape_str(normalized_shape) << " must name 1 to "
      << x.dim() << " trailing dims of " << shape_str(x.shape());
  for (int i = 0; i < k; i++)
    OPFORGE_CHECK(x.shape()[size_t(x.dim() - k + i)] == normalized_shape[size_t(i)])
        << "layer_norm: normalized_shape " << shape_str(normalized_shape)
        << " does not match the trailing dims of " << shape_str(x.shape());
  for (const Tensor* t : {&weight, &bias})
    OPFORGE_CHECK(!t->defined() || t->shape() == normalized_shape)
        << "layer_norm: " << (t == &weight ? "weight" : "bias") << " has shape "
        << shape_str(t->shape()) << ", expected " << shape_str(normalized_shape);
  const DType d = is_floating(x.dtype()) ? x.dtype() : DType::Float32;
  const RowsOfD v(x.shape(), normalized_shape.size());
  Tensor w = weight.defined() ? weight.detach().to(d) : Tensor::ones(normalized_shape, d);
  Tensor b = bias.defined() ? bias.detach().to(d) : Tensor::zeros(normalized_shape, d);
  Tensor mean, rstd;
  auto forward = [&] {
    std::vector<Tensor> r =
        run_per_channel(OPFORGE_OP("layer_norm"), x.detach().to(d).reshape({1, v.rows, v.D}), {},
                        {w.reshape({v.D}), b.reshape({v.D})}, {eps});
    mean = r[1];
    rstd = r[2];
    return r[0].reshape(x.shape());
  };
  std::optional<Shape> bias_shape;
  if (bias.defined() && bias.requires_grad()) bias_shape = bias.shape();
  return autograd::differentiable("layer_norm", {x, weight, bias}, forward, [&](const Tensor&) {
    return
        [sx = autograd::SavedTensor(x), sw = autograd::SavedTensor(w),
         smean = autograd::SavedTensor(mean), srstd = autograd::SavedTensor(rstd), normalized_shape,
         need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
         bias_shape](const std::vector<Tensor>& g) {
          return layer_norm_grads(sx.unpack("layer_norm"), sw.unpack("layer_norm"),
                                  smean.unpack("layer_norm"), srstd.unpack("layer_norm"),
                                  normalized_shape, need_x, need_w, bias_shape, g[0]);
        };
  });
}

}  // namespace opforge
