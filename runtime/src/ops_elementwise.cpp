// Elementwise family: dtype promotion, NumPy broadcasting by stride-0 views, and the collapse of
// any N-d call onto at most six strided dims.
#include <climits>
#include <cmath>

#include "kernel_call.hpp"

namespace opforge {
namespace {
using namespace detail;

const KernelGroup& resolve_group(const OpInfo& op, DType compute) {
  if (const KernelGroup* g = op.find_group(std::string(dtype_name(compute)))) return *g;
  // Float-only ops (exp, sqrt, ...) on integers compute in float32, as PyTorch does; ops with
  // integer kernels (neg, abs, ...) reject the dtypes they lack.
  bool float_only = !op.find_group("int32") && !op.find_group("int64") && !op.find_group("bool");
  if (!is_floating(compute) && float_only)
    if (const KernelGroup* g = op.find_group("float32")) return *g;
  return op.group(std::string(dtype_name(compute)));
}

Tensor run_elementwise(const OpInfo& op, std::vector<Tensor> in, const AttrValues& attrs) {
  OPFORGE_CHECK(op.family == "elementwise")
      << op.name << " is a " << op.family << " op, not elementwise";
  OPFORGE_CHECK(int(in.size()) == op.num_inputs)
      << op.name << ": expected " << op.num_inputs << " input(s), got " << in.size();
  bool any = false;
  DType compute = DType::Bool;
  for (size_t i = 0; i < in.size(); i++) {
    OPFORGE_CHECK(in[i].defined()) << op.name << ": input " << i << " is undefined";
    if ((op.flags >> i) & 1) continue;
    compute = any ? promote(compute, in[i].dtype()) : in[i].dtype();
    any = true;
  }
  const KernelGroup& g = resolve_group(op, compute);
  for (size_t i = 0; i < in.size(); i++) {
    DType want = (op.flags >> i) & 1 ? DType::Bool : g.in_dtype;
    if (in[i].dtype() != want) in[i] = cast(in[i], want);
  }
  Shape shape = broadcast_shapes(op.name.c_str(), in);
  Tensor out = Tensor::empty(shape, g.out_dtype);
  if (out.numel() == 0) return place_like(out, in);

  std::vector<Tensor> expanded;
  std::vector<const Shape*> strides;
  for (auto& t : in) expanded.push_back(t.expand(shape));
  for (auto& t : expanded) strides.push_back(&t.strides());
  strides.push_back(&out.strides());
  std::vector<View> views(in.size() + 1);
  if (!collapse(shape, strides, views)) {
    // More than six independent strides: materialise the inputs, which then collapse to 1-D.
    for (auto& t : expanded) t = t.contiguous();
    collapse(shape, strides, views);
  }
  KernelArgs args;
  for (size_t i = 0; i < in.size(); i++) {
    args.buffer(views[i].bind(expanded[i]));
  }
  args.attrs(op, attrs);
  args.buffer(views.back().bind(out));
  launch(g, extents_of(views.back()), std::move(args));
  return out;
}

// A Python number next to a tensor takes the tensor's dtype unless it does not fit it.
Tensor scalar_for(const Tensor& t, double v) {
  bool integral = std::floor(v) == v && std::isfinite(v);
  DType d = t.dtype();
  if (d == DType::Bool) d = integral ? DType::Int64 : DType::Float32;
  if (!is_floating(d) && !integral) d = DType::Float32;
  if (d == DType::Int32 && (v < INT32_MIN || v > INT32_MAX)) d = DType::Int64;
  if (d == DType::Int64 && (v < -0x1p63 || v >= 0x1p63)) d = DType::Float64;
  return Tensor::scalar(v, d);
}

}  // namespace

Tensor elementwise(const std::string& name, const std::vector<Tensor>& inputs,
                   const AttrValues& attrs) {
  return run_elementwise(op_info(name), inputs, attrs);
}

#define OPFORGE_DEFINE_UNARY(name)            \
  Tensor name(const Tensor& x) {              \
    static const OpInfo& op = op_info(#name); \
    return run_elementwise(op, {x}, {});      \
  }
OPFORGE_UNARY_OPS(OPFORGE_DEFINE_UNARY)
#undef OPFORGE_DEFINE_UNARY

Tensor leaky_relu(const Tensor& x, double alpha) {
  static const OpInfo& op = op_info("leaky_relu");
  return run_elementwise(op, {x}, {alpha});
}
Tensor elu(const Tensor& x, double alpha) {
  static const OpInfo& op = op_info("elu");
  return run_elementwise(op, {x}, {alpha});
}
Tensor clip(const Tensor& x, double lo, double hi) {
  static const OpInfo& op = op_info("clip");
  OPFORGE_CHECK(!(lo > hi)) << "clip: min " << lo << " is greater than max " << hi;
  return run_elementwise(op, {x}, {lo, hi});
}

#define OPFORGE_DEFINE_BINARY(name)               \
  Tensor name(const Tensor& a, const Tensor& b) { \
    static const OpInfo& op = op_info(#name);     \
    return run_elementwise(op, {a, b}, {});       \
  }                                               \
  Tensor name(const Tensor& a, double b) { return name(a, scalar_for(a, b)); }
OPFORGE_BINARY_OPS(OPFORGE_DEFINE_BINARY)
#undef OPFORGE_DEFINE_BINARY

Tensor logical_and(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_and");
  return run_elementwise(op, {a, b}, {});
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_or");
  return run_elementwise(op, {a, b}, {});
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_xor");
  return run_elementwise(op, {a, b}, {});
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("where");
  OPFORGE_CHECK(cond.defined() && cond.dtype() == DType::Bool)
      << "where: the condition must be a bool tensor, got "
      << (cond.defined() ? std::string(dtype_name(cond.dtype())) : std::string("undefined"));
  return run_elementwise(op, {cond, a, b}, {});
}

Tensor cast(const Tensor& x, DType dtype) {
  OPFORGE_CHECK(x.defined()) << "cast: input is undefined";
  if (x.dtype() == dtype) return x;
  static const OpInfo& op = op_info("cast");
  const KernelGroup& g =
      op.group(std::string(dtype_name(x.dtype())) + "_to_" + std::string(dtype_name(dtype)));
  Tensor out = Tensor::empty(x.shape(), dtype);
  if (out.numel() > 0) run_strided(g, x, out);
  return out;
}

}  // namespace opforge
