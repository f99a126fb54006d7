// The recording side of autograd: a tensor's Meta and its Tensor methods (requires_grad_, grad,
// detach, ...), saved tensors and their version check, the node that a formula becomes, and the
// rules for in-place writes under autograd.
#include <algorithm>
#include <atomic>

#include "autograd/record.hpp"
#include "core/storage.hpp"
#include "opforge/ops.hpp"

namespace opforge {
namespace autograd {
namespace {
std::atomic<uint64_t> next_sequence{1};

// One recorded op: its backward formula and, inside it, the tensors the formula saved.
class Formula : public Node {
 public:
  Formula(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    OPFORGE_CHECK(fn_) << "autograd: backward through " << name_
                       << " a second time, but the first backward() freed what it saved; pass "
                          "retain_graph = true to the first one to go through a graph twice";
    return fn_(grads);
  }
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

}  // namespace

std::shared_ptr<Meta> meta_of(const Tensor& t) {
  if (!t.autograd_meta()) t.set_autograd_meta(std::make_shared<Meta>());
  return t.autograd_meta();
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<Meta> leaf, const Tensor& like)
    : leaf_(std::move(leaf)) {
  outputs.push_back({like.shape(), like.dtype()});
  sequence = UINT64_MAX;  // no node depends on it: when it runs does not matter
}

void accumulate_into(Tensor& slot, Tensor g) {
  if (!slot.defined()) {
    // Kept as it is only if nothing else holds it and it owns its elements (an expanded view, as
    // sum's gradient is, would make grad() unwritable).
    bool owned = g.is_contiguous() && g.storage().use_count() == 1 && g.offset() == 0 &&
                 g.storage()->bytes == size_t(g.numel()) * g.element_size();
    slot = owned ? g.detach() : g.detach().clone();
  } else {
    slot.add_(g);  // in place, as PyTorch: an optimiser may hold the gradient's handle
  }
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor grad;
  std::vector<std::function<void(const Tensor&)>> hooks;
  {
    std::lock_guard<std::mutex> lk(leaf_->mu);
    accumulate_into(leaf_->grad, std::move(grads.at(0)));
    if (leaf_->hooks.empty()) return {};
    grad = leaf_->grad;
    for (const auto& [id, hook] : leaf_->hooks) hooks.push_back(hook);
  }
  for (const auto& hook : hooks) hook(grad);  // outside the lock: a hook may read the gradient
  return {};
}

Edge gradient_edge(const Tensor& t) {
  const auto& m = t.autograd_meta();
  if (!m) return {};
  for (const Meta* v = m.get(); v->base; v = v->base.get())
    OPFORGE_CHECK(v->base->history == v->base_history)
        << "autograd: a view is used after the tensor it views was written in place (which gave "
           "that tensor a new history); make the view again after the write";
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  std::lock_guard<std::mutex> lk(m->mu);
  std::shared_ptr<Node> acc = m->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(m, t);
    m->accumulator = acc;
  }
  return {acc, 0};
}

SavedTensor::SavedTensor(const Tensor& t)
    : data_(t.defined() ? t.detach() : Tensor()), version_(t.defined() ? t.version() : 0) {}

Tensor SavedTensor::unpack(const std::string& op) const {
  if (data_.defined() && data_.version() != version_)
    throw Error("autograd: a tensor that " + op +
                " saved for its gradient was written in place since (version " +
                std::to_string(version_) + " then, " + std::to_string(data_.version()) +
                " now), so its gradient would be wrong; write into a clone() instead, or after "
                "backward()");
  return data_;
}

bool wants_grad(std::span<const Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (t.autograd_meta() && t.autograd_meta()->requires_grad) return grad_enabled();
  return false;
}
bool wants_grad(TensorRefs inputs) {
  for (const Tensor& t : inputs)
    if (t.autograd_meta() && t.autograd_meta()->requires_grad) return grad_enabled();
  return false;
}

void record(const std::string& name, std::span<const Tensor> inputs, std::span<Tensor> outputs,
            BackwardFn fn, bool view) {
  auto node = std::make_shared<Formula>(name, std::move(fn));
  node->sequence = next_sequence.fetch_add(1, std::memory_order_relaxed);
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(gradient_edge(t));
    node->inputs.push_back({t.shape(), t.dtype()});
  }
  for (size_t k = 0; k < outputs.size(); k++) {
    Tensor& out = outputs[k];
    node->outputs.push_back({out.shape(), out.dtype()});
    if (!is_floating(out.dtype())) continue;  // indices, masks: no gradient
    auto m = std::make_shared<Meta>();
    m->requires_grad = true;
    m->grad_fn = node;
    m->output_nr = int(k);
    m->is_view = view;
    if (view && !inputs.empty() && inputs[0].autograd_meta()) {
      m->base = inputs[0].autograd_meta();
      m->base_history = m->base->history;
    }
    out.set_autograd_meta(std::move(m));
  }
}

void no_gradient(const std::string& op, const std::string& why) {
  throw Error(op + " has no gradient yet (" + why +
              "), and an input requires one; call it under autograd::NoGradGuard or on "
              "detach()ed inputs");
}

void check_in_place(const std::string& op, const Tensor& self) {
  if (!grad_enabled()) return;
  if (const auto& m = self.autograd_meta(); m && m->requires_grad) {
    OPFORGE_CHECK(m->grad_fn) << op
                              << ": a leaf tensor that requires a gradient is written in place; do "
                                 "it under autograd::NoGradGuard (as an optimiser step does) or "
                                 "write into a clone()";
    OPFORGE_CHECK(!m->is_view) << op
                               << ": writes in place into a view of a tensor that requires a "
                                  "gradient; autograd does not follow in-place writes into views "
                                  "yet: use the out-of-place op";
  }
  // A part of a larger storage (a slice of a buffer): the tensor it is part of would not get the
  // write's history.
  bool whole = self.offset() == 0 && self.is_contiguous() &&
               self.storage()->bytes == size_t(self.numel()) * self.element_size();
  OPFORGE_CHECK(whole) << op
                       << ": writes a gradient-carrying result into part of a larger tensor (a "
                          "view); autograd does not follow in-place writes into views yet: build "
                          "the tensor with out-of-place ops (concat, pad, where)";
}

void take_history(const Tensor& self, const Tensor& result) {
  const auto& from = result.autograd_meta();
  OPFORGE_CHECK(from && from->grad_fn) << "autograd: an in-place write without a recorded result";
  std::shared_ptr<Meta> m = meta_of(self);
  if (m->retains_grad && m->grad_fn) {  // the retained gradient moves to the new history
    auto& r = m->grad_fn->retained;
    r.erase(std::remove_if(r.begin(), r.end(), [&](const auto& e) { return e.second.lock() == m; }),
            r.end());
    from->grad_fn->retained.push_back({from->output_nr, m});
  }
  m->requires_grad = true;
  m->grad_fn = from->grad_fn;
  m->output_nr = from->output_nr;
  m->is_view = false;
  m->history++;
}

}  // namespace autograd

using autograd::Meta;

bool Tensor::requires_grad() const { return autograd_ && autograd_->requires_grad; }

Tensor& Tensor::requires_grad_(bool on) {
  OPFORGE_CHECK(defined()) << "requires_grad_: the tensor is undefined";
  if (!is_leaf()) {
    OPFORGE_CHECK(on) << "requires_grad_(false) on a tensor made by " << autograd_->grad_fn->name()
                      << ": only leaves can stop requiring a gradient; use detach()";
    return *this;
  }
  OPFORGE_CHECK(!on || is_floating(dtype_))
      << "requires_grad_: only floating tensors can require a gradient, this one is "
      << dtype_name(dtype_);
  if (on || autograd_) autograd::meta_of(*this)->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !autograd_ || !autograd_->grad_fn; }

Tensor Tensor::grad() const { return autograd_ ? autograd_->grad : Tensor(); }

void Tensor::set_grad(const Tensor& g) {
  OPFORGE_CHECK(defined()) << "set_grad: the tensor is undefined";
  OPFORGE_CHECK(!g.defined() || (g.shape() == shape_ && g.dtype() == dtype_))
      << "set_grad: a gradient of shape " << shape_str(g.shape()) << " and dtype "
      << dtype_name(g.dtype()) << " for a tensor of shape " << shape_str(shape_) << " and dtype "
      << dtype_name(dtype_);
  if (g.defined() || autograd_) autograd::meta_of(*this)->grad = g;
}

void Tensor::retain_grad() const {
  OPFORGE_CHECK(requires_grad()) << "retain_grad: the tensor does not require a gradient";
  if (is_leaf()) return;  // leaves keep theirs anyway
  std::lock_guard<std::mutex> lk(autograd_->mu);
  if (autograd_->retains_grad) return;
  autograd_->retains_grad = true;
  autograd_->grad_fn->retained.push_back({autograd_->output_nr, autograd_});
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  return autograd_ ? autograd_->grad_fn : nullptr;
}

void Tensor::backward() const { backward(Tensor()); }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this},
                     gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                     retain_graph);
}

Tensor Tensor::detach() const {
  OPFORGE_CHECK(defined()) << "detach: the tensor is undefined";
  return Tensor(storage_, dtype_, shape_, strides_, offset_);
}

uint32_t Tensor::version() const {
  return storage_ ? storage_->version.load(std::memory_order_relaxed) : 0;
}

}  // namespace opforge

namespace opforge::autograd {

Tensor function(const std::string& name, const std::vector<Tensor>& inputs,
                const std::function<Tensor()>& forward,
                std::function<std::vector<Tensor>(const Tensor& g)> backward) {
  OPFORGE_CHECK(forward && backward) << name << ": a custom function needs forward and backward";
  return differentiable(name, std::span<const Tensor>(inputs), forward, [&](const Tensor&) {
    return [name, n = inputs.size(), backward = std::move(backward)](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads = backward(g[0]);
      OPFORGE_CHECK(grads.size() == n) << name << ": backward returned " << grads.size()
                                       << " gradient(s) for " << n << " input(s)";
      return grads;
    };
  });
}

uint64_t register_post_accumulate_grad_hook(const Tensor& leaf,
                                            std::function<void(const Tensor& grad)> hook) {
  OPFORGE_CHECK(leaf.defined() && leaf.requires_grad() && !leaf.grad_fn())
      << "register_post_accumulate_grad_hook: the tensor is not a leaf that requires a gradient";
  static std::atomic<uint64_t> next{1};
  const uint64_t id = next++;
  const std::shared_ptr<Meta>& m = leaf.autograd_meta();
  std::lock_guard<std::mutex> lk(m->mu);
  m->hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t id) {
  const std::shared_ptr<Meta>& m = leaf.autograd_meta();
  if (!m) return;
  std::lock_guard<std::mutex> lk(m->mu);
  std::erase_if(m->hooks, [&](const auto& h) { return h.first == id; });
}

}  // namespace opforge::autograd
