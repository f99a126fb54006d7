// Gradients of the elementwise ops: each differentiable op's backward kernel (`<op>_backward`,
// generated from its DSL definition, placed per call like any kernel) computes every input's
// gradient at the broadcast shape; here they are summed back to each input's shape.
#include "kernels/kernel_call.hpp"
#include "opforge/ops.hpp"

namespace opforge {
using namespace detail;

Tensor sum_to(const Tensor& x, const Shape& shape) {
  OPFORGE_CHECK(x.defined()) << "sum_to: the tensor is undefined";
  const Shape& from = x.shape();
  OPFORGE_CHECK(shape.size() <= from.size())
      << "sum_to: shape " << shape_str(shape) << " has more dims than the tensor's "
      << shape_str(from);
  const size_t lead = from.size() - shape.size();
  std::vector<int> axes;
  for (size_t d = 0; d < from.size(); d++) {
    if (d < lead) {
      axes.push_back(int(d));
      continue;
    }
    int64_t want = shape[d - lead];
    OPFORGE_CHECK(want == from[d] || want == 1)
        << "sum_to: shape " << shape_str(shape) << " does not broadcast to the tensor's "
        << shape_str(from) << " (dim " << d << ": " << want << " against " << from[d] << ")";
    if (want == 1 && from[d] != 1) axes.push_back(int(d));
  }
  if (axes.empty()) return x;
  return sum(x, axes, true).reshape(shape);
}

std::vector<Tensor> elementwise_backward(const std::string& name, const std::vector<Tensor>& inputs,
                                         const Tensor& grad, const AttrValues& attrs,
                                         const std::vector<bool>& needed) {
  const OpInfo& op = op_info(name);
  OPFORGE_CHECK(op.family == "elementwise")
      << name << " is a " << op.family << " op; elementwise_backward takes elementwise ops";
  const OpInfo* backward = find_op(backward_name(name));
  OPFORGE_CHECK(backward != nullptr)
      << name << " has no backward kernel: its gradient is zero where it is defined (floor, "
      << "ceil, round, sign) or it is not differentiable (comparisons, logic, integer ops)";
  OPFORGE_CHECK(int(inputs.size()) == op.num_inputs)
      << name << " backward: expected " << op.num_inputs << " input(s), got " << inputs.size();
  OPFORGE_CHECK(grad.defined()) << name << " backward: the gradient is undefined";
  OPFORGE_CHECK(is_floating(grad.dtype()))
      << name << " backward: the gradient must be floating, got " << dtype_name(grad.dtype());
  for (size_t i = 0; i < inputs.size(); i++) {
    OPFORGE_CHECK(inputs[i].defined()) << name << " backward: input " << i << " is undefined";
    if ((op.flags >> i) & 1) continue;
    OPFORGE_CHECK(is_floating(inputs[i].dtype()))
        << name << " backward: input " << i << " is " << dtype_name(inputs[i].dtype())
        << "; gradients are defined for float32 and float64 inputs only";
  }
  Shape shape = broadcast_shapes(name.c_str(), std::span<const Tensor>(inputs));
  OPFORGE_CHECK(grad.shape() == shape)
      << name << " backward: the gradient has shape " << shape_str(grad.shape())
      << ", the result has shape " << shape_str(shape);
  std::vector<Tensor> args = inputs;
  args.push_back(grad);
  std::vector<Tensor> full = elementwise_results(backward->name, args, attrs);
  OPFORGE_CHECK(needed.empty() || needed.size() == full.size())
      << name << " backward: " << needed.size() << " flags in `needed` for " << full.size()
      << " gradients (one per non-bool input)";
  std::vector<Tensor> grads;
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); i++) {
    if ((op.flags >> i) & 1) continue;
    const bool want = needed.empty() || needed[k];
    Tensor g = full.at(k++);
    grads.push_back(want ? cast(sum_to(g, inputs[i].shape()), inputs[i].dtype()) : Tensor());
  }
  return grads;
}

}  // namespace opforge
