// Movement family: strided copies (contiguous, concat, pad, broadcast writes) and index gathers.
// Reshape, transpose, slice and expand are views in tensor.cpp and need no kernel.
#include <cmath>
#include <numeric>

#include "autograd/record.hpp"
#include "kernels/kernel_call.hpp"

namespace opforge {
using namespace detail;

namespace {
// copy_into under autograd: the destination is overwritten completely, so it takes a history of
// its own: the source's gradient summed back to the source's shape, and a zero gradient for what
// the destination held (PyTorch keeps a non-leaf that is overwritten with a constant in the graph).
void copy_recorded(const Tensor& dst, const Tensor& src) {
  if (!is_floating(dst.dtype())) {  // an integer or bool copy carries no gradient
    autograd::NoGradGuard no_grad;
    return copy_into(dst, src);
  }
  autograd::check_in_place("copy_", dst);
  const Tensor inputs[] = {src, dst};  // dst as it was: its history so far
  {
    autograd::NoGradGuard no_grad;
    copy_into(dst, src);
  }
  Tensor result = dst.detach();
  autograd::record(
      "copy_", inputs, std::span<Tensor>(&result, 1),
      [shape = src.shape(), dst_shape = dst.shape(),
       dtype = dst.dtype()](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{sum_to(g[0], shape), Tensor::zeros(dst_shape, dtype)};
      });
  autograd::take_history(dst, result);
}
}  // namespace

void copy_into(const Tensor& dst, const Tensor& src_in) {
  static const OpInfo& op = op_info("copy");
  OPFORGE_CHECK(dst.defined() && src_in.defined()) << "copy_into: a tensor is undefined";
  if (autograd::wants_grad({dst, src_in})) return copy_recorded(dst, src_in);
  Tensor src = src_in.dtype() == dst.dtype() ? src_in : cast(src_in, dst.dtype());
  const Tensor both[] = {src, dst};
  Shape b = broadcast_shapes("copy_into", both);
  OPFORGE_CHECK(b == dst.shape()) << "copy_into: source of shape " << shape_str(src.shape())
                                  << " does not broadcast to the destination shape "
                                  << shape_str(dst.shape());
  if (dst.numel() == 0) return;
  begin_write("copy_into", dst);
  // A source that overlaps the destination in memory is read completely before any write.
  if (may_overlap(src, dst)) src = src.clone();
  run_strided(op.group(std::string(dtype_name(dst.dtype()))), src.expand(dst.shape()), dst);
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  if (autograd::wants_grad(std::span<const Tensor>(xs)))
    return autograd::differentiable(
        "concat", std::span<const Tensor>(xs), [&] { return concat(xs, axis); },
        [&](const Tensor& out) {
          int ax = wrap_axis("concat", axis, out.dim());
          std::vector<int64_t> sizes;
          for (const Tensor& x : xs) sizes.push_back(x.shape()[ax]);
          return [ax, sizes](const std::vector<Tensor>& g) {
            std::vector<Tensor> parts;
            int64_t off = 0;
            for (int64_t n : sizes) {
              parts.push_back(g[0].slice(ax, off, off + n));
              off += n;
            }
            return parts;
          };
        });
  OPFORGE_CHECK(!xs.empty()) << "concat: needs at least one tensor";
  const Tensor& first = xs[0];
  OPFORGE_CHECK(first.defined() && first.dim() >= 1) << "concat: tensors need at least 1 dimension";
  int ax = wrap_axis("concat", axis, first.dim());
  DType d = first.dtype();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); i++) {
    OPFORGE_CHECK(xs[i].defined() && xs[i].dim() == first.dim())
        << "concat: tensor " << i << " has rank " << xs[i].dim() << ", expected " << first.dim();
    for (int k = 0; k < first.dim(); k++)
      OPFORGE_CHECK(k == ax || xs[i].shape()[k] == first.shape()[k])
          << "concat: tensor " << i << " has shape " << shape_str(xs[i].shape()) << ", expected "
          << shape_str(first.shape()) << " in every dimension but " << ax;
    d = promote(d, xs[i].dtype());
    total = checked_add("concat", "the concatenated size", total, xs[i].shape()[ax]);
  }
  Shape s = first.shape();
  s[ax] = total;
  Tensor out = Tensor::empty(s, d);
  int64_t off = 0;
  for (const auto& x : xs) {
    int64_t n = x.shape()[ax];
    if (n) copy_into(out.slice(ax, off, off + n), x);
    off += n;
  }
  return out;
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value) {
  if (autograd::wants_grad({x}))
    return autograd::differentiable(
        "pad", {x}, [&] { return pad(x, pads, value); },
        [&](const Tensor&) {
          return [pads, shape = x.shape()](const std::vector<Tensor>& g) {
            Tensor inner = g[0];
            for (size_t d = 0; d < shape.size(); d++)
              inner = inner.slice(int(d), pads[d].first, pads[d].first + shape[d]);
            return std::vector<Tensor>{inner};
          };
        });
  OPFORGE_CHECK(x.defined()) << "pad: input is undefined";
  OPFORGE_CHECK(int(pads.size()) == x.dim())
      << "pad: got " << pads.size() << " (before, after) pairs for a tensor of rank " << x.dim();
  Shape s = x.shape();
  for (int d = 0; d < x.dim(); d++) {
    OPFORGE_CHECK(pads[d].first >= 0 && pads[d].second >= 0)
        << "pad: padding of dimension " << d << " is negative (" << pads[d].first << ", "
        << pads[d].second << ")";
    s[d] = checked_add("pad", "the padded size",
                       checked_add("pad", "the padded size", s[d], pads[d].first), pads[d].second);
  }
  Tensor out = Tensor::empty(s, x.dtype());
  copy_into(out, Tensor::scalar(value, x.dtype()));
  Tensor inner = out;
  for (int d = 0; d < x.dim(); d++)
    inner = inner.slice(d, pads[d].first, pads[d].first + x.shape()[d]);
  copy_into(inner, x);
  return out;
}

namespace {
// index_select's and index_add's index: 1-D, int32 or int64, every entry in [-n, n); as int64.
Tensor checked_index(const char* op, const Tensor& index, int64_t n, int axis) {
  OPFORGE_CHECK(index.dim() <= 1) << op << ": index must be 1-D, got shape "
                                  << shape_str(index.shape());
  OPFORGE_CHECK(index.dtype() == DType::Int32 || index.dtype() == DType::Int64)
      << op << ": index must be int32 or int64, got " << dtype_name(index.dtype());
  Tensor idx = index.to(DType::Int64).reshape({-1}).contiguous();
  const auto* iv = static_cast<const int64_t*>(idx.const_data());
  for (int64_t i = 0; i < idx.numel(); i++)
    OPFORGE_CHECK(iv[i] >= -n && iv[i] < n)
        << op << ": index " << iv[i] << " is out of range for dimension " << axis << " of size "
        << n;
  return idx;
}

// The (inner, n, outer) split of a shape around `axis`.
std::array<int64_t, 2> outer_inner(const Shape& s, int axis) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= s[size_t(d)];
  for (int d = axis + 1; d < int(s.size()); d++) inner *= s[size_t(d)];
  return {outer, inner};
}

Tensor index_add_kernel(const Tensor& dest_in, int ax, const Tensor& idx, const Tensor& src_in) {
  const OpInfo& op = OPFORGE_OP("index_add");
  const KernelGroup& g = op.group(std::string(dtype_name(dest_in.dtype())));
  Tensor dest = dest_in.dim() == 0 ? dest_in.reshape({1}) : dest_in;
  Tensor src = src_in.to(dest.dtype()).contiguous();
  Tensor out = Tensor::empty(dest.shape(), dest.dtype());
  if (out.numel() == 0) return place_like(out, {dest, src});
  auto [outer, inner] = outer_inner(dest.shape(), ax);
  int64_t n = dest.shape()[size_t(ax)], rows = idx.numel();
  // dest may be any view (a zero gradient is a broadcast 0); it is read as (inner, n, outer).
  Tensor d = dest.reshape({outer, n, inner});
  View dv = view_of(d);
  KernelArgs args;
  args.input(std::move(dv));
  args.input(dense_view(idx, {rows}));
  args.input(dense_view(src, {inner, rows, outer}));
  args.output(dense_view(out, {inner, n, outer}));
  launch(g, extents({inner, n, outer}), std::move(args));
  return out.reshape(dest_in.dim() == 0 ? Shape{} : dest_in.shape());
}
}  // namespace

Tensor index_select(const Tensor& x_in, int axis, const Tensor& index) {
  OPFORGE_CHECK(x_in.defined() && index.defined()) << "index_select: an input is undefined";
  if (autograd::wants_grad({x_in}))
    return autograd::differentiable(
        "index_select", {x_in}, [&] { return index_select(x_in, axis, index); },
        [&](const Tensor&) {
          return [shape = x_in.shape(), dtype = x_in.dtype(), axis,
                  idx = index.to(DType::Int64).clone()](const std::vector<Tensor>& g) {
            Tensor zeros = Tensor::zeros({}, dtype).expand(shape);
            return std::vector<Tensor>{index_add(zeros, axis, idx, g[0])};
          };
        });
  static const OpInfo& op = op_info("gather");
  Tensor x = x_in.dim() == 0 ? x_in.reshape({1}) : x_in;
  int ax = wrap_axis("index_select", axis, x.dim());
  int64_t n = x.shape()[ax];
  Tensor idx = checked_index("index_select", index, n, ax);
  x = x.contiguous();
  auto [outer, inner] = outer_inner(x.shape(), ax);
  Shape s = x.shape();
  s[ax] = idx.numel();
  Tensor out = Tensor::empty(s, x.dtype());
  if (out.numel() == 0) return place_like(out, {x, index});
  const KernelGroup& g = op.group(std::string(dtype_name(x.dtype())));
  KernelArgs args;
  args.input(dense_view(x, {inner, n, outer}));
  args.input(dense_view(idx, {idx.numel()}));
  args.output(dense_view(out, {inner, idx.numel(), outer}));
  launch(g, extents({inner, idx.numel(), outer}), std::move(args));
  return out;
}

Tensor index_add(const Tensor& x, int axis, const Tensor& index, const Tensor& source,
                 double alpha) {
  OPFORGE_CHECK(x.defined() && index.defined() && source.defined())
      << "index_add: an input is undefined";
  OPFORGE_CHECK(std::isfinite(alpha)) << "index_add: alpha is " << alpha;
  if (autograd::wants_grad({x, source}))
    return autograd::differentiable(
        "index_add", {x, source}, [&] { return index_add(x, axis, index, source, alpha); },
        [&](const Tensor&) {
          return [axis, alpha, idx = index.to(DType::Int64).clone(), xd = x.dtype(),
                  sd = source.dtype()](const std::vector<Tensor>& g) {
            Tensor gs = index_select(g[0], axis, idx);
            return std::vector<Tensor>{g[0].to(xd), (alpha == 1 ? gs : mul(gs, alpha)).to(sd)};
          };
        });
  Tensor dest = x.dim() == 0 ? x.reshape({1}) : x;
  int ax = wrap_axis("index_add", axis, dest.dim());
  Tensor idx = checked_index("index_add", index, dest.shape()[size_t(ax)], ax);
  Shape want = dest.shape();
  want[size_t(ax)] = idx.numel();
  Tensor src = source.dim() == 0 ? source.reshape({1}) : source;
  OPFORGE_CHECK(src.shape() == want) << "index_add: source has shape " << shape_str(source.shape())
                                     << ", expected " << shape_str(want) << " (the input's, with "
                                     << idx.numel() << " along dimension " << ax << ")";
  OPFORGE_CHECK(is_floating(x.dtype()) || x.dtype() == DType::Int32 || x.dtype() == DType::Int64)
      << "index_add: the input is " << dtype_name(x.dtype())
      << "; expected int32, int64, float32 or float64";
  OPFORGE_CHECK(is_floating(x.dtype()) || !is_floating(source.dtype()))
      << "index_add: a " << dtype_name(source.dtype()) << " source cannot be added into a "
      << dtype_name(x.dtype()) << " input";
  return index_add_kernel(x, ax, idx, alpha == 1 ? source : mul(source, alpha));
}

Tensor gather(const Tensor& x, int axis, const Tensor& index) {
  OPFORGE_CHECK(x.defined() && index.defined()) << "gather: an input is undefined";
  OPFORGE_CHECK(x.dim() >= 1)
      << "gather: the input must have at least 1 dimension, got a 0-d tensor";
  int ax = wrap_axis("gather", axis, x.dim());
  Tensor flat = index_select(x, ax, index.reshape({-1}));
  Shape s(x.shape().begin(), x.shape().begin() + ax);
  s.insert(s.end(), index.shape().begin(), index.shape().end());
  s.insert(s.end(), x.shape().begin() + ax + 1, x.shape().end());
  return flat.reshape(s);
}

}  // namespace opforge
