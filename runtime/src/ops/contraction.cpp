// Contraction family: NumPy matmul and BLAS-style gemm onto batched (B, M, K) x (B, K, N). Batch
// broadcasting uses stride-0 views; only a transposed inner dimension is copied.
#include "autograd/record.hpp"
#include "kernels/kernel_call.hpp"

namespace opforge {
namespace {
using namespace detail;

// The operand's batch dims as one (extent, stride), or false if they do not nest.
bool one_batch_stride(const Tensor& t, int64_t& stride) {
  int nb = t.dim() - 2;
  stride = 0;
  int64_t expect = -1;
  for (int d = nb - 1; d >= 0; d--) {
    if (t.shape()[d] == 1) continue;
    if (expect < 0) {
      stride = t.strides()[d];
    } else if (t.strides()[d] != expect) {
      return false;
    }
    expect = t.strides()[d] * t.shape()[d];
  }
  return true;
}

// Halide view (inner, outer, batch) of a 2-D-or-more operand. The kernels read B (and C) in
// vectors along its last dim, which must then have stride 1 (a transposed B is copied); A may have
// any strides (`any_inner`).
View matrix_view(Tensor& t, int64_t batch, bool any_inner = false) {
  int64_t bs;
  if (!any_inner && t.strides().back() != 1 && t.shape().back() != 1) t = t.contiguous();
  if (!one_batch_stride(t, bs)) {
    t = t.contiguous();
    one_batch_stride(t, bs);
  }
  View v;
  v.bind(t);
  v.n = 3;
  int r = t.dim();
  v.extent[0] = t.shape()[r - 1];
  v.stride[0] = t.shape()[r - 1] == 1 ? 1 : t.strides()[r - 1];
  v.extent[1] = t.shape()[r - 2];
  v.stride[1] = t.strides()[r - 2];
  v.extent[2] = batch;
  v.stride[2] = batch == 1 ? 0 : bs;
  return v;
}

// A product's C, (M, N) at any strides (a bias is broadcast at stride 0), as the kernels' (n, m,
// batch) view.
View c_view(const Tensor& c) {
  View v;
  v.bind(c);
  v.n = 3;
  v.extent[0] = c.size(1);
  v.stride[0] = c.strides()[1];
  v.extent[1] = c.size(0);
  v.stride[1] = c.strides()[0];
  v.extent[2] = 1;
  v.stride[2] = 0;
  return v;
}

const KernelGroup& float_group(const OpInfo& op, DType a, DType b) {
  return op.group(std::string(dtype_name(promote(a, b))));
}

}  // namespace

namespace {
// The gradients of matmul(a, b) given g, by matmul itself on transposed views (1-D operands
// promoted as the forward does, broadcast batch dims summed back).
std::vector<Tensor> matmul_grads(const Tensor& a, const Tensor& b, const Tensor& g_in) {
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  Tensor g = g_in;
  if (a.dim() == 1) g = g.unsqueeze(b.dim() == 1 ? 0 : -2);
  if (b.dim() == 1) g = g.unsqueeze(-1);
  Tensor ga = matmul(g, b2.transpose(-1, -2)), gb = matmul(a2.transpose(-1, -2), g);
  return {sum_to(ga, a2.shape()).reshape(a.shape()), sum_to(gb, b2.shape()).reshape(b.shape())};
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (autograd::wants_grad({a_in, b_in}))
    return autograd::differentiable(
        "matmul", {a_in, b_in}, [&] { return matmul(a_in, b_in); },
        [&](const Tensor&) {
          return [sa = autograd::SavedTensor(a_in),
                  sb = autograd::SavedTensor(b_in)](const std::vector<Tensor>& g) {
            return matmul_grads(sa.unpack("matmul"), sb.unpack("matmul"), g[0]);
          };
        });
  static const OpInfo& op = op_info("matmul");
  OPFORGE_CHECK(a_in.defined() && b_in.defined()) << "matmul: an input is undefined";
  OPFORGE_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1)
      << "matmul: both operands need at least 1 dimension, got shapes " << shape_str(a_in.shape())
      << " and " << shape_str(b_in.shape());
  const KernelGroup& g = float_group(op, a_in.dtype(), b_in.dtype());
  Tensor a = a_in.to(g.in_dtype), b = b_in.to(g.in_dtype);
  bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  if (a_vec) a = a.unsqueeze(0);
  if (b_vec) b = b.unsqueeze(1);
  int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  OPFORGE_CHECK(b.size(-2) == K) << "matmul: inner dimensions do not match: "
                                 << shape_str(a_in.shape()) << " @ " << shape_str(b_in.shape())
                                 << " (" << K << " vs " << b.size(-2) << ")";
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes("matmul", std::vector<Shape>{ab, bb});
  } catch (const Error& e) {
    throw Error("matmul: the batch dimensions of " + shape_str(a_in.shape()) + " and " +
                shape_str(b_in.shape()) + " do not broadcast (" + e.what() + ")");
  }
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {M, K});
  b_full.insert(b_full.end(), {K, N});
  out_shape.insert(out_shape.end(), {M, N});
  a = a.expand(a_full);
  b = b.expand(b_full);
  int64_t B = shape_numel(batch);
  Tensor out =
      (K == 0) ? Tensor::zeros(out_shape, g.out_dtype) : Tensor::empty(out_shape, g.out_dtype);
  if (out.numel() > 0 && K > 0) {
    KernelArgs args;
    args.input(matrix_view(a, B, true));
    args.input(matrix_view(b, B));
    args.output(dense_view(out, {N, M, B}));
    launch(g, extents({N, M, K, B}), std::move(args));
  }
  if (a_vec) out = out.squeeze(-2);
  if (b_vec) out = out.squeeze(-1);
  return out;
}

Tensor gemm(const Tensor& a_in, const Tensor& b_in, const Tensor& c_in, double alpha, double beta,
            bool trans_a, bool trans_b) {
  if (autograd::wants_grad({a_in, b_in, c_in}))
    return autograd::differentiable(
        "gemm", {a_in, b_in, c_in},
        [&] { return gemm(a_in, b_in, c_in, alpha, beta, trans_a, trans_b); },
        [&](const Tensor&) {
          std::optional<Shape> c_shape;
          if (c_in.defined()) c_shape = c_in.shape();
          return [sa = autograd::SavedTensor(a_in), sb = autograd::SavedTensor(b_in), c_shape,
                  alpha, beta, trans_a, trans_b](const std::vector<Tensor>& grads) {
            // out = alpha op(A) op(B) + beta C: d op(A) = alpha g op(B)^T, d op(B) = alpha op(A)^T
            // g; a transposed operand's gradient is computed transposed (dB = alpha g^T op(A)),
            // so that it comes out in the operand's own layout. Transposed views go in as the
            // product's first operand, which the kernels read at any strides.
            Tensor a = sa.unpack("gemm"), b = sb.unpack("gemm"), g = grads[0];
            Tensor opa = trans_a ? a.transpose(0, 1) : a, opb = trans_b ? b.transpose(0, 1) : b;
            Tensor gt = g.transpose(0, 1);
            Tensor ga = trans_a ? matmul(opb, gt) : matmul(g, opb.transpose(0, 1));
            Tensor gb = trans_b ? matmul(gt, opa) : matmul(opa.transpose(0, 1), g);
            if (alpha != 1) {
              ga = mul(ga, alpha);
              gb = mul(gb, alpha);
            }
            return std::vector<Tensor>{ga, gb, c_shape ? sum_to(mul(g, beta), *c_shape) : Tensor()};
          };
        });
  static const OpInfo& op = op_info("gemm");
  OPFORGE_CHECK(a_in.defined() && b_in.defined()) << "gemm: an input is undefined";
  OPFORGE_CHECK(a_in.dim() == 2 && b_in.dim() == 2)
      << "gemm: A and B must be 2-D, got " << shape_str(a_in.shape()) << " and "
      << shape_str(b_in.shape());
  const KernelGroup& g = float_group(op, a_in.dtype(), b_in.dtype());
  Tensor a = a_in.to(g.in_dtype), b = b_in.to(g.in_dtype);
  if (trans_a) a = a.transpose(0, 1);
  if (trans_b) b = b.transpose(0, 1);
  int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  OPFORGE_CHECK(b.size(0) == K) << "gemm: inner dimensions do not match: op(A) is "
                                << shape_str(a.shape()) << ", op(B) is " << shape_str(b.shape());
  Tensor c = c_in.defined() ? c_in.to(g.in_dtype) : Tensor::scalar(0, g.in_dtype);
  if (!c_in.defined()) beta = 0;
  OPFORGE_CHECK(c.dim() <= 2) << "gemm: C must have at most 2 dims, got " << shape_str(c.shape());
  Shape cb = broadcast_shapes("gemm", std::vector<Shape>{c.shape(), {M, N}});
  OPFORGE_CHECK(cb == Shape({M, N}))
      << "gemm: C of shape " << shape_str(c.shape()) << " does not broadcast to the result shape "
      << shape_str({M, N});
  Tensor ce = c.expand({M, N});
  Tensor out = Tensor::empty({M, N}, g.out_dtype);
  if (out.numel() == 0) return place_like(out, {a, b, c});
  if (K == 0) return place_like(mul(ce.contiguous(), beta), {a, b, c});
  KernelArgs args;
  args.input(matrix_view(a, 1, true));
  args.input(matrix_view(b, 1));
  args.input(c_view(ce));
  args.attrs(op, {alpha, beta});
  args.output(dense_view(out, {N, M, 1}));
  launch(g, extents({N, M, K, 1}), std::move(args));
  return out;
}

namespace {
// The rows of a linear layer's input: the product of its dims but the last.
int64_t rows(const Shape& x_shape) {
  int64_t m = 1;
  for (size_t d = 0; d + 1 < x_shape.size(); d++) m *= x_shape[d];
  return m;
}

// The gradients of linear(x, w, b, act) given g at its output y: the activation's first (ReLU's
// from y itself, which is positive exactly where its input was), then matmul on views (the
// weight's gradient reads g transposed, which contraction kernels take at any strides). x is only
// read for the weight's gradient.
struct LinearGrads {
  Shape x_shape;
  DType x_dtype, b_dtype;
  bool need_x, need_w, need_b, has_b;
  std::vector<Tensor> operator()(const Tensor& x, const Tensor& w, const Tensor& y,
                                 Tensor g) const {
    if (y.defined()) g = elementwise_backward("relu", {y}, g, {}, {true})[0];
    const int64_t M = rows(x_shape);
    Tensor g2 = g.reshape({M, w.size(0)});
    std::vector<Tensor> grads(has_b ? 3 : 2);
    if (need_x) grads[0] = matmul(g2, w).reshape(x_shape).to(x_dtype);
    if (need_w) grads[1] = matmul(g2.transpose(0, 1), x.reshape({M, w.size(1)})).to(w.dtype());
    if (need_b) grads[2] = sum(g2, {0}).to(b_dtype);
    return grads;
  }
};
}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Activation act) {
  if (autograd::wants_grad({x_in, w_in, b_in})) {
    std::vector<Tensor> in = {x_in, w_in};
    if (b_in.defined()) in.push_back(b_in);
    return autograd::differentiable(
        "linear", std::span<const Tensor>(in), [&] { return linear(x_in, w_in, b_in, act); },
        [&](const Tensor& y) {
          // Only the gradients some input asks for: a first layer's input (the data) wants none,
          // and its gradient would be a whole product.
          LinearGrads grads{x_in.shape(),
                            x_in.dtype(),
                            b_in.defined() ? b_in.dtype() : DType::Float32,
                            x_in.requires_grad(),
                            w_in.requires_grad(),
                            b_in.defined() && b_in.requires_grad(),
                            b_in.defined()};
          return [sx = grads.need_w ? autograd::SavedTensor(x_in) : autograd::SavedTensor(),
                  sw = autograd::SavedTensor(w_in),
                  sy = act == Activation::relu ? autograd::SavedTensor(y) : autograd::SavedTensor(),
                  relu = act == Activation::relu, grads](const std::vector<Tensor>& g) {
            return grads(grads.need_w ? sx.unpack("linear") : Tensor(), sw.unpack("linear"),
                         relu ? sy.unpack("linear") : Tensor(), g[0]);
          };
        });
  }
  const OpInfo& op = OPFORGE_OP("linear");
  OPFORGE_CHECK(x_in.defined() && w_in.defined()) << "linear: an input is undefined";
  OPFORGE_CHECK(w_in.dim() == 2) << "linear: weight must be (out_features, in_features), got "
                                 << shape_str(w_in.shape());
  const int64_t N = w_in.size(0), K = w_in.size(1);
  OPFORGE_CHECK(x_in.dim() >= 1 && x_in.size(-1) == K)
      << "linear: input of shape " << shape_str(x_in.shape()) << " has "
      << (x_in.dim() ? x_in.size(-1) : 0) << " features, the weight " << shape_str(w_in.shape())
      << " expects " << K;
  OPFORGE_CHECK(!b_in.defined() || (b_in.dim() == 1 && b_in.size(0) == N))
      << "linear: bias has shape " << shape_str(b_in.shape()) << ", expected [" << N << "]";
  DType dt = promote(x_in.dtype(), w_in.dtype());
  if (b_in.defined()) dt = promote(dt, b_in.dtype());
  const KernelGroup& g = op.group(std::string(dtype_name(is_floating(dt) ? dt : DType::Float32)));
  Tensor x = x_in.to(g.in_dtype), w = w_in.to(g.in_dtype);
  Tensor b = b_in.defined() ? b_in.to(g.in_dtype) : Tensor::zeros({N}, g.in_dtype);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(N);
  const int64_t M = rows(x.shape());
  x = x.reshape({M, K});
  if (M * N == 0) return place_like(Tensor::empty(out_shape, g.out_dtype), {x, w});
  if (K == 0) {  // no terms: the bias, through the activation
    Tensor y = b.expand({M, N}).contiguous();
    return (act == Activation::relu ? relu(y) : y).reshape(out_shape);
  }
  Tensor out = Tensor::empty({M, N}, g.out_dtype);
  KernelArgs args;
  args.input(matrix_view(x, 1, true));
  args.input(matrix_view(w, 1));  // (K, N, 1): K at stride 1, a row of the weight per output
  Tensor rows_of_b = b.expand({M, N});
  args.input(c_view(rows_of_b));
  args.attrs(op, {act == Activation::relu ? 1.0 : 0.0});
  args.output(dense_view(out, {N, M, 1}));
  launch(g, extents({N, M, K, 1}), std::move(args));
  return out.reshape(out_shape);
}

}  // namespace opforge
