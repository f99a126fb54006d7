// Elementwise family: dtype promotion, NumPy broadcasting by stride-0 views, and the collapse of
// any N-d call onto at most six strided dims.
#include <bit>
#include <climits>
#include <cmath>
#include <functional>
#include <optional>
#include <span>

#include "autograd/record.hpp"
#include "core/storage.hpp"
#include "kernels/kernel_call.hpp"

namespace opforge {
namespace {
using namespace detail;

const KernelGroup& resolve_group(const OpInfo& op, DType compute) {
  if (const KernelGroup* g = op.find_group(compute)) return *g;
  // Float-only ops (exp, sqrt, ...) on integers compute in float32, as PyTorch does; ops with
  // integer kernels (neg, abs, ...) reject the dtypes they lack.
  bool float_only =
      !op.find_group(DType::Int32) && !op.find_group(DType::Int64) && !op.find_group(DType::Bool);
  if (!is_floating(compute) && float_only)
    if (const KernelGroup* g = op.find_group(DType::Float32)) return *g;
  return op.group(std::string(dtype_name(compute)));
}

// PyTorch's rule for writing a result into a tensor of another dtype (out=, in-place): floats
// may not go into integers, nor anything but bool into bool.
bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != DType::Bool && to == DType::Bool) return false;
  return true;
}

// The dtype the op computes in: its non-bool inputs' promoted dtype (`dtype_of(i)`, i < n).
template <class DTypeOf>
DType compute_dtype(const OpInfo& op, size_t n, const DTypeOf& dtype_of) {
  bool any = false;
  DType compute = DType::Bool;
  for (size_t i = 0; i < n; i++) {
    if ((op.flags >> i) & 1) continue;
    compute = any ? promote(compute, dtype_of(i)) : dtype_of(i);
    any = true;
  }
  return compute;
}

// The dtype input i has in the group's kernels.
DType kernel_dtype(const OpInfo& op, const KernelGroup& g, size_t i) {
  return (op.flags >> i) & 1 ? DType::Bool : g.in_dtype;
}

// A tensor the kernel may write directly: the result's dtype, and no input overlaps it unless it is
// the very same view (a pointwise kernel reads each element before it writes it).
bool writes_directly(const Tensor& out, DType dtype, std::span<const Tensor> in, size_t skip) {
  if (out.dtype() != dtype) return false;
  for (size_t i = 0; i < in.size(); i++)
    if (i != skip && may_overlap(in[i], out) && !same_view(in[i], out)) return false;
  return true;
}

// Launches the kernel over `in` (already at the kernel's dtypes) writing `results` (or, for an
// op with inout buffers, the inputs in inout_mask), all of `shape`. Returns false, launching
// nothing, when a written tensor cannot be the kernel's output as it is: its innermost collapsed
// dimension is not unit-strided (the kernels store vectors) or it does not collapse onto six dims.
// Allocates nothing.
bool launch_elementwise(const OpInfo& op, const KernelGroup& g, std::span<const Tensor> in,
                        std::span<const double> attrs, const Shape& shape, uint32_t inout_mask,
                        std::span<const Tensor> results) {
  auto is_inout = [&](size_t i) { return (inout_mask >> i) & 1; };
  // Inputs of the result's shape are used as they are; the others as broadcast (stride-0) views.
  TensorList expanded;
  std::array<const Tensor*, kMaxKernelBuffers> src;
  std::array<const Shape*, kMaxKernelBuffers> strides;
  size_t n = 0;
  for (const Tensor& t : in) {
    if (t.shape() != shape) {
      expanded.push_back(t.expand(shape));
      src[n] = &expanded[expanded.size() - 1];
    } else {
      src[n] = &t;
    }
    strides[n] = &src[n]->strides();
    n++;
  }
  for (const Tensor& r : results) strides[n++] = &r.strides();
  std::array<View, kMaxKernelBuffers> views;
  std::span<const Shape* const> st(strides.data(), n);
  std::span<View> vs(views.data(), n);
  if (!collapse(shape, st, vs)) {
    // More than six independent strides: materialise the inputs, which then collapse further.
    for (size_t i = 0; i < in.size(); i++)
      if (!is_inout(i)) {
        expanded.push_back(src[i]->contiguous());
        src[i] = &expanded[expanded.size() - 1];
        strides[i] = &src[i]->strides();
      }
    if (!collapse(shape, st, vs)) return false;
  }
  const size_t first_out = inout_mask ? size_t(std::countr_zero(inout_mask)) : in.size();
  for (size_t i = 0; i < in.size(); i++)
    if (is_inout(i) && views[i].stride[0] != 1) return false;
  for (size_t k = 0; k < results.size(); k++)
    if (views[in.size() + k].stride[0] != 1) return false;
  KernelArgs args;
  for (size_t i = 0; i < in.size(); i++) {
    View& v = views[i].bind(*src[i]);
    if (is_inout(i))
      args.inout(std::move(v));
    else
      args.input(std::move(v));
  }
  args.attrs(op, attrs);
  for (size_t k = 0; k < results.size(); k++)
    args.output(std::move(views[in.size() + k].bind(results[k])));
  launch(g, extents_of(views[first_out]), std::move(args));
  return true;
}

// The common call without copying its tensors, broadcasting or collapsing: new results (no out=,
// no in-place buffer), every input already at the kernel's dtype, all of one shape and
// contiguous. Returns false, doing nothing, when the call is not one; the general path below
// then runs it.
// The caller has checked the op's family and input count (check_call).
// `results`: op.num_outputs tensors, set only when the call runs here.
bool run_dense(const OpInfo& op, std::span<const Tensor* const> in, std::span<const double> attrs,
               std::span<Tensor> results) {
  if (op.inout_mask || in.empty()) return false;
  for (const Tensor* t : in)
    if (!t->defined()) return false;
  const KernelGroup* g =
      op.find_group(compute_dtype(op, in.size(), [&](size_t i) { return in[i]->dtype(); }));
  if (!g) return false;
  const Shape& shape = in[0]->shape();
  for (size_t i = 0; i < in.size(); i++) {
    const Tensor& t = *in[i];
    if (t.dtype() != kernel_dtype(op, *g, i)) return false;
    if (i > 0 && t.shape() != shape) return false;
    if (!t.is_contiguous()) return false;
  }
  const int64_t n = in[0]->numel();
  if (n == 0) return false;
  for (Tensor& r : results) r = Tensor::empty(shape, g->out_dtype);
  KernelArgs args;
  for (const Tensor* t : in) args.flat(*t, n, BufferRole::input);
  args.attrs(op, attrs);
  for (const Tensor& r : results) args.flat(r, n, BufferRole::output);
  CallExtents ext;
  ext.n = kMaxDims;
  ext.e[0] = n;
  for (int i = 1; i < kMaxDims; i++) ext.e[i] = 1;
  launch(*g, ext, std::move(args));
  return true;
}

// check_call's refusal, out of line: the messages stay off the per-call path.
[[noreturn]] void refuse_call(const OpInfo& op, size_t inputs, size_t outs) {
  OPFORGE_CHECK(op.family == "elementwise")
      << op.name << " is a " << op.family << " op, not elementwise";
  OPFORGE_CHECK(int(inputs) == op.num_inputs)
      << op.name << ": expected " << op.num_inputs << " input(s), got " << inputs;
  OPFORGE_CHECK(outs == 0 || int(outs) == op.num_outputs)
      << op.name << ": expected " << op.num_outputs << " output tensor(s), got " << outs;
  throw Error("internal: " + op.name + ": a call was refused, but its counts match");
}

// An elementwise call's op and tensor counts, checked once per call.
inline void check_call(const OpInfo& op, size_t inputs, size_t outs) {
  if (int(inputs) != op.num_inputs || (outs != 0 && int(outs) != op.num_outputs) ||
      op.family != "elementwise")
    refuse_call(op, inputs, outs);
}

// The general path, after check_call: any dtypes, broadcasting, out=, in-place buffers. `outs`:
// tensors to write the results into (out=), or empty to allocate them. An op with inout buffers
// writes its results into those inputs, which must already have the broadcast shape. Returns the
// results (for an inout op, the written inputs). On a known shape bucket nothing is allocated but
// the results.
TensorList run_general(const OpInfo& op, std::span<const Tensor> inputs,
                       std::span<const double> attrs, std::span<const Tensor> outs) {
  TensorList in(inputs);
  for (size_t i = 0; i < in.size(); i++)
    OPFORGE_CHECK(in[i].defined()) << op.name << ": input " << i << " is undefined";
  const KernelGroup& g =
      resolve_group(op, compute_dtype(op, in.size(), [&](size_t i) { return in[i].dtype(); }));
  const uint32_t inout = op.inout_mask;
  auto is_inout = [&](size_t i) { return (inout >> i) & 1; };
  for (size_t i = 0; i < in.size(); i++) {
    if (!is_inout(i)) continue;
    OPFORGE_CHECK(in[i].dtype() == g.in_dtype)
        << op.name << ": input " << i << " is written in place, but it is "
        << dtype_name(in[i].dtype()) << " and the op computes in " << dtype_name(g.in_dtype)
        << " here; convert it first";
    for (size_t j = 0; j < i; j++)
      OPFORGE_CHECK(!is_inout(j) || !may_overlap(in[i], in[j]))
          << op.name << ": inputs " << j << " and " << i
          << " are both written in place and share memory";
    begin_write(op.name.c_str(), in[i]);
  }
  for (size_t i = 0; i < in.size(); i++) {
    DType want = kernel_dtype(op, g, i);
    if (in[i].dtype() != want) in[i] = cast(in[i], want);
  }
  Shape shape = broadcast_shapes(op.name.c_str(), in.span());
  for (size_t k = 0; k < outs.size(); k++) {
    const Tensor& o = outs[k];
    OPFORGE_CHECK(o.defined()) << op.name << ": output " << k << " is undefined";
    OPFORGE_CHECK(o.shape() == shape)
        << op.name << ": output " << k << " has shape " << shape_str(o.shape())
        << ", the result has shape " << shape_str(shape);
    OPFORGE_CHECK(can_cast(g.out_dtype, o.dtype()))
        << op.name << ": the result type " << dtype_name(g.out_dtype)
        << " cannot be cast to output " << k << "'s dtype " << dtype_name(o.dtype());
    begin_write(op.name.c_str(), o);
    for (size_t j = 0; j < k; j++)
      OPFORGE_CHECK(!may_overlap(o, outs[j]))
          << op.name << ": outputs " << j << " and " << k << " share memory";
  }

  if (inout) {
    TensorList targets;
    bool direct = true;
    for (size_t i = 0; i < in.size(); i++) {
      if (!is_inout(i)) continue;
      OPFORGE_CHECK(in[i].shape() == shape)
          << op.name << ": input " << i << " of shape " << shape_str(in[i].shape())
          << " is written in place, but the inputs broadcast to " << shape_str(shape);
      direct = direct && writes_directly(in[i], g.in_dtype, in.span(), i);
      targets.push_back(in[i]);
    }
    if (shape_numel(shape) == 0) return targets;
    if (direct && launch_elementwise(op, g, in.span(), attrs, shape, inout, {})) return targets;
    // A view another input partly overlaps, or one the kernel cannot write as it is: computed
    // on dense copies, then written back.
    for (size_t i = 0; i < in.size(); i++)
      if (is_inout(i)) in[i] = in[i].is_contiguous() ? in[i].clone() : in[i].contiguous();
    launch_elementwise(op, g, in.span(), attrs, shape, inout, {});
    size_t k = 0;
    for (size_t i = 0; i < in.size(); i++)
      if (is_inout(i)) copy_into(targets[k++], in[i]);
    return targets;
  }

  bool direct = !outs.empty();
  for (const Tensor& o : outs)
    direct = direct && writes_directly(o, g.out_dtype, in.span(), in.size());
  if (direct &&
      (shape_numel(shape) == 0 || launch_elementwise(op, g, in.span(), attrs, shape, inout, outs)))
    return TensorList(outs);
  TensorList results;
  for (int k = 0; k < op.num_outputs; k++) results.push_back(Tensor::empty(shape, g.out_dtype));
  if (shape_numel(shape) == 0) {
    for (auto& r : results) r = place_like(r, std::vector<Tensor>(in.begin(), in.end()));
  } else {
    launch_elementwise(op, g, in.span(), attrs, shape, inout, results.span());
  }
  for (size_t k = 0; k < outs.size(); k++) copy_into(outs[k], results[k]);
  if (outs.empty()) return results;
  return TensorList(outs);
}

TensorList run_recorded(const OpInfo& op, std::span<const Tensor> inputs,
                        std::span<const double> attrs, std::span<const Tensor> outs);

// The dense path (run_dense) over any range of tensors (a span of them, a list of references).
template <class Tensors>
bool try_dense(const OpInfo& op, const Tensors& in, std::span<const double> attrs,
               std::span<Tensor> results) {
  std::array<const Tensor*, TensorList::kCapacity> refs;
  size_t n = 0;
  for (const Tensor& t : in) refs[n++] = &t;
  return run_dense(op, std::span<const Tensor* const>(refs.data(), n), attrs, results);
}

// The op's results, undefined until a path sets them.
TensorList blank_results(const OpInfo& op) {
  TensorList results;
  for (int k = 0; k < op.num_outputs; k++) results.push_back(Tensor());
  return results;
}

Tensor one_result(const OpInfo& op, TensorList results) {
  OPFORGE_CHECK(results.size() == 1) << op.name << " has " << results.size()
                                     << " results; call elementwise_results() to get them all";
  return std::move(results[0]);
}

// Runs an elementwise op (see run_general) on the dense path when it can, else the general one;
// a call whose inputs want gradients is recorded (run_recorded).
TensorList run_elementwise(const OpInfo& op, std::span<const Tensor> inputs,
                           std::span<const double> attrs, std::span<const Tensor> outs = {}) {
  check_call(op, inputs.size(), outs.size());
  if (autograd::wants_grad(inputs)) return run_recorded(op, inputs, attrs, outs);
  if (outs.empty()) {
    TensorList results = blank_results(op);
    if (try_dense(op, inputs, attrs, std::span<Tensor>(results.begin(), results.size())))
      return results;
  }
  return run_general(op, inputs, attrs, outs);
}

// The op functions' form: the tensors by reference, copied only where the general path needs them.
using TensorRef = std::reference_wrapper<const Tensor>;

// A checked call of that form that the dense path did not run (`grad`: its inputs want gradients).
TensorList run_listed(const OpInfo& op, std::initializer_list<TensorRef> in,
                      std::span<const double> attrs, std::initializer_list<TensorRef> outs,
                      bool grad) {
  TensorList ins, os;
  for (const Tensor& t : in) ins.push_back(t);
  for (const Tensor& t : outs) {
    // An in-place write under autograd gives its target a history: the caller's handle must
    // share the Meta that the copy here gets it in.
    if (grad) autograd::meta_of(t);
    os.push_back(t);
  }
  if (grad) return run_recorded(op, ins.span(), attrs, os.span());
  return run_general(op, ins.span(), attrs, os.span());
}

TensorList run_elementwise(const OpInfo& op, std::initializer_list<TensorRef> in,
                           std::initializer_list<double> attrs,
                           std::initializer_list<TensorRef> outs = {}) {
  check_call(op, in.size(), outs.size());
  std::span<const double> a(attrs.begin(), attrs.size());
  const bool grad = autograd::wants_grad(in);
  if (outs.size() == 0 && !grad) {
    TensorList results = blank_results(op);
    if (try_dense(op, in, a, std::span<Tensor>(results.begin(), results.size()))) return results;
  }
  return run_listed(op, in, a, outs, grad);
}

// An op function's call of a one-result op: on the dense path the result is made where the caller
// receives it (no list of results, no moves).
Tensor one_elementwise(const OpInfo& op, std::initializer_list<TensorRef> in,
                       std::initializer_list<double> attrs) {
  check_call(op, in.size(), 0);
  std::span<const double> a(attrs.begin(), attrs.size());
  const bool grad = autograd::wants_grad(in);
  Tensor r;
  if (!grad && op.num_outputs == 1 && try_dense(op, in, a, std::span<Tensor>(&r, 1))) return r;
  r = one_result(op, run_listed(op, in, a, {}, grad));
  return r;  // every return names r, so that it is built in the caller's place (NRVO)
}

// The gradient of a recorded call: the op's backward kernel (elementwise_backward), with integer
// inputs taken at the result's dtype and given no gradient. An op with one floating result and no
// backward kernel is one the DSL declared zero_grad (dsl/op.hpp's has_backward builds a kernel for
// every other): its gradient is zero.
autograd::BackwardFn elementwise_formula(const OpInfo& op, std::span<const Tensor> inputs,
                                         std::span<const double> attrs, DType result) {
  if (!find_op(backward_name(op.name))) {  // zero_grad: nothing to save
    std::vector<std::optional<std::pair<Shape, DType>>> zeros;
    for (const Tensor& t : inputs)
      zeros.push_back(is_floating(t.dtype()) ? std::optional(std::pair(t.shape(), t.dtype()))
                                             : std::nullopt);
    return [zeros](const std::vector<Tensor>&) {
      std::vector<Tensor> out;
      for (const auto& z : zeros) out.push_back(z ? Tensor::zeros(z->first, z->second) : Tensor());
      return out;
    };
  }
  std::vector<autograd::SavedTensor> saved(inputs.begin(), inputs.end());
  std::vector<bool> needed;  // per non-bool input: it wants a gradient
  for (size_t i = 0; i < inputs.size(); i++)
    if (!((op.flags >> i) & 1))
      needed.push_back(is_floating(inputs[i].dtype()) && inputs[i].requires_grad());
  return [name = op.name, flags = op.flags, saved = std::move(saved), needed,
          a = AttrValues(attrs.begin(), attrs.end()), result](const std::vector<Tensor>& grads) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < saved.size(); i++) {
      Tensor t = saved[i].unpack(name);
      bool condition = (flags >> i) & 1;
      in.push_back(condition || is_floating(t.dtype()) ? t : cast(t, result));
    }
    std::vector<Tensor> g = elementwise_backward(name, in, grads.at(0), a, needed);
    std::vector<Tensor> out(saved.size());
    size_t k = 0;
    for (size_t i = 0; i < in.size(); i++)
      if (!((flags >> i) & 1)) out[i] = std::move(g.at(k++));
    return out;
  };
}

// A call whose inputs want gradients: run with recording off, then one node for it. out= is
// refused, as PyTorch does; an in-place write is computed out of place from a copy of its target
// (whose old value the gradient may need), recorded, written back, and the target takes the
// result's history.
TensorList run_recorded(const OpInfo& op, std::span<const Tensor> inputs,
                        std::span<const double> attrs, std::span<const Tensor> outs) {
  OPFORGE_CHECK(op.inout_mask == 0)
      << op.name
      << " writes inputs in place and records no gradient, and an input requires one; compose it "
         "from out-of-place ops (add, mul), or run it under autograd::NoGradGuard (as an "
         "optimiser step does)";
  if (op.num_outputs != 1) autograd::no_gradient(op.name, "it has several results");
  if (!outs.empty()) {
    const Tensor& self = outs[0];
    OPFORGE_CHECK(same_view(self, inputs[0]))
        << op.name << ": out= records no gradient (as in PyTorch), and an input requires one; "
        << "call the op without out=";
    autograd::check_in_place(op.name + "_", self);
    // Every input that is the target reads its old value: a copy with the target's history.
    TensorList in(inputs);
    Tensor old = [&] {
      autograd::NoGradGuard no_grad;
      return self.clone();
    }();
    old.set_autograd_meta(self.autograd_meta());
    for (Tensor& t : in)
      if (same_view(t, self)) t = old;
    TensorList r = run_recorded(op, in.span(), attrs, {});
    OPFORGE_CHECK(can_cast(r[0].dtype(), self.dtype()))
        << op.name << "_: the result type " << dtype_name(r[0].dtype())
        << " cannot be written into a " << dtype_name(self.dtype()) << " tensor";
    {
      autograd::NoGradGuard no_grad;
      copy_into(self, r[0]);
    }
    autograd::take_history(self, r[0]);
    return TensorList(outs);
  }
  TensorList results = [&] {
    autograd::NoGradGuard no_grad;
    return run_elementwise(op, inputs, attrs);
  }();
  autograd::record(op.name, inputs, std::span<Tensor>(results.begin(), results.size()),
                   elementwise_formula(op, inputs, attrs, results[0].dtype()));
  return results;
}

// Writes v into a 0-d host tensor of dtype d.
void set_scalar(const Tensor& t, double v) {
  void* p = t.data();
  switch (t.dtype()) {
    case DType::Bool:
      *static_cast<uint8_t*>(p) = v != 0;
      break;
    case DType::Int32:
      *static_cast<int32_t*>(p) = int32_t(v);
      break;
    case DType::Int64:
      *static_cast<int64_t*>(p) = int64_t(v);
      break;
    case DType::Float32:
      *static_cast<float*>(p) = float(v);
      break;
    case DType::Float64:
      *static_cast<double*>(p) = v;
      break;
  }
}

// A Python number next to a tensor takes the tensor's dtype unless it does not fit it. It becomes
// a 0-d tensor (PyTorch's wrapped number) for the length of the call that reads it: each thread
// keeps one per dtype and writes the next number into it, so that add(x, 2.0) allocates nothing
// but its result. One that a queued call still holds, or that went to a GPU, is not kept: no
// device memory outlives the call, and no queued call reads a number written after it.
class WrappedNumber {
 public:
  WrappedNumber(const Tensor& like, double v) {
    bool integral = std::floor(v) == v && std::isfinite(v);
    DType d = like.dtype();
    if (d == DType::Bool) d = integral ? DType::Int64 : DType::Float32;
    if (!is_floating(d) && !integral) d = DType::Float32;
    if (d == DType::Int32 && (v < INT32_MIN || v > INT32_MAX)) d = DType::Int64;
    if (d == DType::Int64 && (v < -0x1p63 || v >= 0x1p63)) d = DType::Float64;
    thread_local std::array<Tensor, std::size(kAllDTypes)> kept;
    slot_ = &kept[size_t(d)];
    if (slot_->defined() && slot_->storage().use_count() == 1 && !slot_->storage()->on_gpus())
      set_scalar(*slot_, v);
    else
      *slot_ = Tensor::scalar(v, d);
    t_ = *slot_;
  }
  ~WrappedNumber() {
    t_ = Tensor();
    // Kept only if the call is over (no queued call holds it: it may yet copy it to its device).
    if (slot_->storage().use_count() > 1 || slot_->storage()->on_gpus()) *slot_ = Tensor();
  }
  WrappedNumber(const WrappedNumber&) = delete;
  WrappedNumber& operator=(const WrappedNumber&) = delete;
  operator const Tensor&() const { return t_; }  // NOLINT: used where the op takes a tensor

 private:
  Tensor t_;
  Tensor* slot_;
};

}  // namespace

Tensor elementwise(const std::string& name, const std::vector<Tensor>& inputs,
                   const AttrValues& attrs) {
  const OpInfo& op = op_info(name);
  return one_result(op, run_elementwise(op, inputs, attrs));
}

std::vector<Tensor> elementwise_results(const std::string& name, const std::vector<Tensor>& inputs,
                                        const AttrValues& attrs, const std::vector<Tensor>& outs) {
  return run_elementwise(op_info(name), inputs, attrs, outs).vector();
}

#define OPFORGE_DEFINE_UNARY(name)                            \
  Tensor name(const Tensor& x) {                              \
    static const OpInfo& op = op_info(#name);                 \
    return one_elementwise(op, {x}, {});                      \
  }                                                           \
  Tensor name##_out(const Tensor& out, const Tensor& x) {     \
    static const OpInfo& op = op_info(#name);                 \
    return std::move(run_elementwise(op, {x}, {}, {out})[0]); \
  }
OPFORGE_UNARY_OPS(OPFORGE_DEFINE_UNARY)
#undef OPFORGE_DEFINE_UNARY

Tensor leaky_relu(const Tensor& x, double alpha) {
  static const OpInfo& op = op_info("leaky_relu");
  return one_elementwise(op, {x}, {alpha});
}
Tensor elu(const Tensor& x, double alpha) {
  static const OpInfo& op = op_info("elu");
  return one_elementwise(op, {x}, {alpha});
}
Tensor clip_out(const Tensor& out, const Tensor& x, double lo, double hi) {
  static const OpInfo& op = op_info("clip");
  OPFORGE_CHECK(!(lo > hi)) << "clip: min " << lo << " is greater than max " << hi;
  OPFORGE_CHECK(!std::isnan(lo) && !std::isnan(hi)) << "clip: a bound is NaN";
  const double bounds[] = {lo, hi};
  return run_elementwise(op, std::span<const Tensor>(&x, 1), bounds,
                         std::span<const Tensor>(&out, out.defined() ? 1 : 0))[0];
}
Tensor clip(const Tensor& x, double lo, double hi) { return clip_out({}, x, lo, hi); }

#define OPFORGE_DEFINE_BINARY(name)                                               \
  Tensor name(const Tensor& a, const Tensor& b) {                                 \
    static const OpInfo& op = op_info(#name);                                     \
    return one_elementwise(op, {a, b}, {});                                       \
  }                                                                               \
  Tensor name(const Tensor& a, double b) { return name(a, WrappedNumber(a, b)); } \
  Tensor name##_out(const Tensor& out, const Tensor& a, const Tensor& b) {        \
    static const OpInfo& op = op_info(#name);                                     \
    return std::move(run_elementwise(op, {a, b}, {}, {out})[0]);                  \
  }                                                                               \
  Tensor name##_out(const Tensor& out, const Tensor& a, double b) {               \
    return name##_out(out, a, WrappedNumber(a, b));                               \
  }
OPFORGE_BINARY_OPS(OPFORGE_DEFINE_BINARY)
#undef OPFORGE_DEFINE_BINARY

Tensor logical_and(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_and");
  return one_elementwise(op, {a, b}, {});
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_or");
  return one_elementwise(op, {a, b}, {});
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("logical_xor");
  return one_elementwise(op, {a, b}, {});
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  static const OpInfo& op = op_info("where");
  OPFORGE_CHECK(cond.defined() && cond.dtype() == DType::Bool)
      << "where: the condition must be a bool tensor, got "
      << (cond.defined() ? std::string(dtype_name(cond.dtype())) : std::string("undefined"));
  return one_elementwise(op, {cond, a, b}, {});
}

std::pair<Tensor, Tensor> sincos(const Tensor& x) {
  static const OpInfo& op = op_info("sincos");
  auto r = run_elementwise(op, {x}, {});
  return {r[0], r[1]};
}

Tensor axpy_(const Tensor& y, double alpha, const Tensor& x) {
  static const OpInfo& op = op_info("axpy_");
  return one_elementwise(op, {y, x}, {alpha});
}

// ---- in-place methods (PyTorch's): the result goes into this tensor, in its dtype ----
namespace {
Tensor& in_place(Tensor& self, const char* name, const Tensor& other) {
  OPFORGE_CHECK(self.defined()) << name << ": the tensor is undefined";
  run_elementwise(op_info(name), {self, other}, {}, {self});
  return self;
}
}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (alpha == 1) return in_place(*this, "add", other);
  OPFORGE_CHECK(defined() && other.defined()) << "add_: a tensor is undefined";
  // One in-place pass (axpy_) where the result stays floating and no gradient is recorded;
  // integers as PyTorch: other * alpha.
  if (is_floating(dtype()) && !autograd::wants_grad({*this, other})) {
    axpy_(*this, alpha, other.dtype() == dtype() ? other : cast(other, dtype()));
    return *this;
  }
  return in_place(*this, "add", mul(other, alpha));
}
Tensor& Tensor::add_(double other) { return add_(WrappedNumber(*this, other)); }
Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  if (alpha == 1) return in_place(*this, "sub", other);
  return add_(other, -alpha);
}
Tensor& Tensor::sub_(double other) { return in_place(*this, "sub", WrappedNumber(*this, other)); }
Tensor& Tensor::mul_(const Tensor& other) { return in_place(*this, "mul", other); }
Tensor& Tensor::mul_(double other) { return in_place(*this, "mul", WrappedNumber(*this, other)); }
Tensor& Tensor::div_(const Tensor& other) { return in_place(*this, "div", other); }
Tensor& Tensor::div_(double other) { return in_place(*this, "div", WrappedNumber(*this, other)); }
Tensor& Tensor::clamp_(double min, double max) {
  OPFORGE_CHECK(defined()) << "clamp_: the tensor is undefined";
  clip_out(*this, *this, min, max);
  return *this;
}
Tensor& Tensor::copy_(const Tensor& src) {
  copy_into(*this, src);
  return *this;
}
Tensor& Tensor::fill_(double value) {
  OPFORGE_CHECK(defined()) << "fill_: the tensor is undefined";
  OPFORGE_CHECK(is_floating(dtype()) || std::isfinite(value))
      << "fill_: " << value << " does not fit a " << dtype_name(dtype()) << " tensor";
  copy_into(*this, Tensor::scalar(value, dtype()));
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }

Tensor cast(const Tensor& x, DType dtype) {
  OPFORGE_CHECK(x.defined()) << "cast: input is undefined";
  if (x.dtype() == dtype) return x;
  if (autograd::wants_grad({x}))
    return autograd::differentiable(
        "cast", {x}, [&] { return cast(x, dtype); },
        [&](const Tensor&) {
          return [from = x.dtype()](const std::vector<Tensor>& g) {
            return std::vector<Tensor>{cast(g[0], from)};
          };
        });
  static const OpInfo& op = op_info("cast");
  const KernelGroup& g =
      op.group(std::string(dtype_name(x.dtype())) + "_to_" + std::string(dtype_name(dtype)));
  Tensor out = Tensor::empty(x.shape(), dtype);
  if (out.numel() > 0) run_strided(g, x, out);
  return out;
}

}  // namespace opforge
