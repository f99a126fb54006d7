// How the op functions record themselves for autograd: a tensor's Meta, saved tensors with their
// version, and differentiable(), which runs an op's forward without recording inside it and then
// attaches one node with the op's backward formula to its result. The formulas themselves live
// next to the ops they differentiate (runtime/src/autograd/formulas_*.cpp).
#pragma once
#include <functional>
#include <initializer_list>
#include <mutex>
#include <span>

#include "opforge/autograd.hpp"

namespace opforge::autograd {

// A tensor's part in autograd, shared by the copies of one handle (Tensor::autograd_meta()).
struct Meta {
  bool requires_grad = false;
  bool retains_grad = false;
  bool is_view = false;  // made by a view method from a tensor that requires a gradient
  Tensor grad;
  std::shared_ptr<Node> grad_fn;    // null for a leaf
  int output_nr = 0;                // which result of grad_fn this tensor is
  std::weak_ptr<Node> accumulator;  // a leaf's AccumulateGrad, while a graph holds it
  // Bumped when an in-place write gives the tensor a new history (take_history): a view made
  // before that leads to the old history, so using it is an Error.
  uint64_t history = 0;
  std::shared_ptr<Meta> base;  // a view's: the tensor it views, and that one's history then
  uint64_t base_history = 0;
  // A leaf's hooks, run after backward() added into its grad()
  // (register_post_accumulate_grad_hook).
  std::vector<std::pair<uint64_t, std::function<void(const Tensor&)>>> hooks;
  // Guards accumulator, grad and hooks: threads that share parameters build graphs and run
  // backward passes at once.
  std::mutex mu;
};

// A leaf's node: adds the gradient that reaches it into the leaf's grad().
class AccumulateGrad : public Node {
 public:
  AccumulateGrad(std::shared_ptr<Meta> leaf, const Tensor& like);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

 private:
  std::shared_ptr<Meta> leaf_;
};

// t's Meta, made (empty) if it has none: a handle whose copies must all see the history an
// in-place write gives it gets one before it is copied.
std::shared_ptr<Meta> meta_of(const Tensor& t);

// Adds g into a gradient slot (grad() of a leaf or of a tensor that retains it): the first one is
// kept if nothing else holds it and it owns its elements, else copied; later ones are added in
// place.
void accumulate_into(Tensor& slot, Tensor g);

// Where a gradient of `t` goes: its grad_fn's result, or its accumulator if it is a leaf that
// requires a gradient (made on first use); invalid if it needs none.
Edge gradient_edge(const Tensor& t);

// A tensor a backward formula needs, kept without its history (no reference cycle from a result
// to its own node) and with the version its storage had when it was saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);  // NOLINT: saving is the only thing one does with a tensor here
  // The tensor, or an Error naming `op` when it was written in place since it was saved.
  Tensor unpack(const std::string& op) const;

 private:
  Tensor data_;
  uint32_t version_ = 0;
};

// Maps the gradients of an op's results to the gradients of its inputs (undefined: none).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;

// Whether a call with these inputs records: grad mode is on and one of them requires a gradient.
// Costs a thread-local read when grad mode is off, and a pointer test per input when no input
// takes part in autograd (the per-call path).
using TensorRefs = std::initializer_list<std::reference_wrapper<const Tensor>>;
bool wants_grad(std::span<const Tensor> inputs);
bool wants_grad(TensorRefs inputs);

// Attaches a node named `name` to `outputs` (those of a floating dtype; the others need no
// gradient) whose backward is `fn`, with one edge per input. `view`: the outputs are views of
// input 0 (in-place ops on them are refused).
void record(const std::string& name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
            BackwardFn fn, bool view = false);

// Runs forward() and, when its inputs want a gradient, runs it with recording off and records
// make_backward(result) on the result. The inputs are taken by reference: a call that records
// nothing copies none of them.
template <class Forward, class MakeBackward>
Tensor differentiable(const std::string& name, std::span<const Tensor> inputs, Forward&& forward,
                      MakeBackward&& make_backward, bool view = false) {
  if (!wants_grad(inputs)) return forward();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = forward();
  }
  record(name, inputs, std::span<Tensor>(&out, 1), make_backward(out), view);
  return out;
}
template <class Forward, class MakeBackward>
Tensor differentiable(const std::string& name, TensorRefs inputs, Forward&& forward,
                      MakeBackward&& make_backward, bool view = false) {
  if (!wants_grad(inputs)) return forward();
  std::vector<Tensor> in(inputs.begin(), inputs.end());
  return differentiable(name, std::span<const Tensor>(in), std::forward<Forward>(forward),
                        std::forward<MakeBackward>(make_backward), view);
}

// An Error for an op whose gradient is not available, raised when it is called with inputs that
// want one (so nothing is recorded that backward cannot follow).
[[noreturn]] void no_gradient(const std::string& op, const std::string& why);
inline void check_no_grad_needed(const std::string& op, std::span<const Tensor> inputs,
                                 const char* why) {
  if (wants_grad(inputs)) no_gradient(op, why);
}

// After an in-place write of `result` (recorded) into `self`: self takes result's history, as
// PyTorch rebases an in-place op's target. Refuses a leaf that requires a gradient and a view.
void check_in_place(const std::string& op, const Tensor& self);
void take_history(const Tensor& self, const Tensor& result);

}  // namespace opforge::autograd
