// Reduction family: any set of axes becomes the canonical (inner, reduced, outer) view, permuting
// (and copying) only when the reduced axes are not adjacent.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/kernel_call.hpp"

namespace opforge {
namespace {
using namespace detail;

constexpr int kNormalize = 1;  // ReductionKind::normalize in the DSL

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

Tensor run_reduction(const OpInfo& op, Tensor x, std::vector<int> axes, bool keepdims,
                     const AttrValues& attrs, const std::vector<Tensor>& extra) {
  const char* name = op.name.c_str();
  OPFORGE_CHECK(op.family == "reduction")
      << op.name << " is a " << op.family << " op, not a reduction";
  OPFORGE_CHECK(x.defined()) << name << ": input is undefined";
  const KernelGroup& g = group_for(op, x.dtype());
  if (x.dtype() != g.in_dtype) x = cast(x, g.in_dtype);
  bool normalize = op.flags == kNormalize;
  OPFORGE_CHECK(int(extra.size()) + 1 == op.num_inputs)
      << name << ": expected " << op.num_inputs - 1 << " extra input(s), got " << extra.size();

  bool scalar_in = x.dim() == 0;
  if (scalar_in) x = x.reshape({1});
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
  if (axes.back() - axes.front() + 1 != int(axes.size())) {
    OPFORGE_CHECK(!normalize) << name << ": the normalised axes must be adjacent";
    std::vector<int> perm;
    for (int d = 0; d < rank; d++)
      if (!std::binary_search(axes.begin(), axes.end(), d)) perm.push_back(d);
    int first = int(perm.size());
    perm.insert(perm.end(), axes.begin(), axes.end());
    x = x.permute(perm);
    for (size_t i = 0; i < axes.size(); i++) axes[i] = first + int(i);
  }
  x = x.contiguous();
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
  if (out.numel() == 0) return place_like(out, {x});
  if (reduced == 0) {
    double v;
    OPFORGE_CHECK(empty_reduction_value(op.name, v))
        << name << ": cannot reduce over an empty axis (size 0): the op has no identity value";
    return place_like(Tensor::full(out_shape, v, g.out_dtype), {x});
  }
  KernelArgs args;
  args.input(dense_view(x, {inner, reduced, outer}));
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
  return out;
}

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

}  // namespace

Tensor reduction(const std::string& op, const Tensor& x, std::vector<int> axes, bool keepdims,
                 const AttrValues& attrs, const std::vector<Tensor>& extra) {
  return run_reduction(op_info(op), x, std::move(axes), keepdims, attrs, extra);
}

Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("sum"), x, axes, keepdims);
}
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("mean"), x, axes, keepdims);
}
Tensor prod(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("prod"), x, axes, keepdims);
}
Tensor max(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("max"), x, axes, keepdims);
}
Tensor min(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("min"), x, axes, keepdims);
}
Tensor logsumexp(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_named(OPFORGE_OP("logsumexp"), x, axes, keepdims);
}
Tensor var(const Tensor& x, const std::vector<int>& axes, bool keepdims, double ddof) {
  return reduce_named(OPFORGE_OP("var"), x, axes, keepdims, {ddof});
}
Tensor argmax(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce(OPFORGE_OP("argmax"), x, axis, keepdims);
}
Tensor argmin(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce(OPFORGE_OP("argmin"), x, axis, keepdims);
}
Tensor softmax(const Tensor& x, int axis) {
  return reduce_named(OPFORGE_OP("softmax"), x, {axis}, true);
}
Tensor log_softmax(const Tensor& x, int axis) {
  return reduce_named(OPFORGE_OP("log_softmax"), x, {axis}, true);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  OPFORGE_CHECK(x.defined()) << "layer_norm: input is undefined";
  int k = int(normalized_shape.size());
  OPFORGE_CHECK(k >= 1 && k <= x.dim())
      << "layer_norm: normalized_shape " << shape_str(normalized_shape) << " must name 1 to "
      << x.dim() << " trailing dims of " << shape_str(x.shape());
  for (int i = 0; i < k; i++)
    OPFORGE_CHECK(x.shape()[x.dim() - k + i] == normalized_shape[i])
        << "layer_norm: normalized_shape " << shape_str(normalized_shape)
        << " does not match the trailing dims of " << shape_str(x.shape());
  for (const Tensor* t : {&weight, &bias})
    OPFORGE_CHECK(!t->defined() || t->shape() == normalized_shape)
        << "layer_norm: " << (t == &weight ? "weight" : "bias") << " has shape "
        << shape_str(t->shape()) << ", expected " << shape_str(normalized_shape);
  DType d = is_floating(x.dtype()) ? x.dtype() : DType::Float32;
  Tensor w = weight.defined() ? weight : Tensor::ones(normalized_shape, d);
  Tensor b = bias.defined() ? bias : Tensor::zeros(normalized_shape, d);
  std::vector<int> axes;
  for (int i = x.dim() - k; i < x.dim(); i++) axes.push_back(i);
  static const OpInfo& op = op_info("layer_norm");
  return run_reduction(op, x, axes, true, {eps}, {w, b});
}

}  // namespace opforge
