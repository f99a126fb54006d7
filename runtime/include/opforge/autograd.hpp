// Reverse-mode automatic differentiation on a tape, as PyTorch's autograd: an op whose input
// requires a gradient records a Node (its backward formula and the tensors that formula needs) on
// its results; backward() walks the recorded graph from a result back to the leaves and adds each
// leaf's gradient into its grad(). Grad mode is per thread (NoGradGuard turns it off, as
// torch.no_grad does). The tensor side of the API (requires_grad_, grad, backward, detach) is on
// Tensor (tensor.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "opforge/tensor.hpp"

namespace opforge::autograd {

class Node;
struct Meta;

// Where a gradient goes: input `input_nr` of node `fn` (a recorded op, or a leaf's accumulator).
struct Edge {
  std::shared_ptr<Node> fn;
  int input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// One recorded op. apply() takes the gradient of each of its results (none undefined: the engine
// fills zeros) and returns one gradient per recorded input (undefined where the input needs none).
class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // After a backward pass without retain_graph: the saved tensors are freed, and applying the
  // node again is an Error.
  virtual void release() {}

  std::vector<Edge> next_edges;  // one per input of the op, invalid where no gradient flows
  // The shape and dtype of each result (zeros for a result no gradient reached) and each input
  // (the engine checks every gradient a node returns against them).
  struct TensorMeta {
    Shape shape;
    DType dtype = DType::Float32;
  };
  std::vector<TensorMeta> outputs, inputs;
  // Records are numbered in order: a later op runs first in backward.
  uint64_t sequence = 0;
  // Results that keep their gradient (Tensor::retain_grad), by result index.
  std::vector<std::pair<int, std::weak_ptr<Meta>>> retained;
};

// Whether ops record gradients on this thread (on by default).
bool grad_enabled();
void set_grad_enabled(bool enabled);

// Sets grad mode for a scope and restores it after; NoGradGuard turns it off (torch.no_grad).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

// Adds the gradient of sum_i <tensors[i], grads[i]> into grad() of every leaf they depend on. A
// one-element tensor's gradient may be omitted (it is 1). Without retain_graph the graph's saved
// tensors are freed, so a second backward through it is an Error.
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grads = {},
              bool retain_graph = false);

// The gradients of sum_i <outputs[i], grad_outputs[i]> with respect to each of `inputs`, returned
// rather than added into grad() (torch.autograd.grad). An input the outputs do not depend on is an
// Error unless allow_unused, which returns an undefined tensor for it.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// A differentiable op of the caller's own, as torch.autograd.Function: forward() runs with grad
// mode off and returns the result; when an input wants a gradient, backward(g) is recorded on the
// result and later maps the result's gradient g to one gradient per input (undefined where it
// gives none; each of its input's shape, or backward() raises an Error naming `name`). Tensors
// backward needs are its own captures: unlike the built-in ops', they are not checked against
// in-place writes after the forward.
Tensor function(const std::string& name, const std::vector<Tensor>& inputs,
                const std::function<Tensor()>& forward,
                std::function<std::vector<Tensor>(const Tensor& g)> backward);

// Runs hook(grad) after each backward() that adds into this leaf's grad() (PyTorch's
// register_post_accumulate_grad_hook), on the thread that runs that backward(); autograd::grad()
// adds nothing and runs none. Returns an id for remove_post_accumulate_grad_hook.
uint64_t register_post_accumulate_grad_hook(const Tensor& leaf,
                                            std::function<void(const Tensor& grad)> hook);
void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id);

}  // namespace opforge::autograd
