// The backward pass: from the roots' gradients, every node the roots depend on runs once, after all
// the nodes that feed it gradients (counted beforehand), latest-recorded first; each gradient a
// node returns is checked against its input's shape and added into the buffer of the node it goes
// to. Leaves' accumulators add into grad(); autograd::grad() takes the gradients at its inputs'
// edges instead and accumulates nothing.
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/record.hpp"
#include "opforge/ops.hpp"

namespace opforge::autograd {

namespace {
thread_local bool grad_mode = true;

std::string describe(const Shape& s, DType d) {
  return shape_str(s) + " " + std::string(dtype_name(d));
}

// A gradient for a tensor of `meta`'s shape: `g` itself when it fits, cast when only its dtype
// differs (an op that computed in a wider dtype), else an Error naming who returned it.
Tensor fit(Tensor g, const Node::TensorMeta& meta, const std::string& who, size_t index) {
  OPFORGE_CHECK(g.shape() == meta.shape)
      << "autograd: " << who << " returned a gradient of shape " << shape_str(g.shape())
      << " for its input " << index << " of shape " << shape_str(meta.shape);
  if (g.dtype() != meta.dtype) g = cast(g, meta.dtype);
  return g;
}

void accumulate(Tensor& slot, Tensor g) { slot = slot.defined() ? add(slot, g) : std::move(g); }

struct Pass {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  // autograd::grad(): where each input's gradient is taken, and what it got.
  std::map<std::pair<Node*, int>, std::vector<size_t>> captures;
  std::vector<Tensor> captured;
  bool accumulate_leaves = true;
  // autograd::grad(): only the nodes on a path to a capture run (the others' results are not
  // asked for); empty: every node runs.
  std::unordered_set<Node*> on_path;
  bool runs(Node* n) const { return captures.empty() || on_path.count(n); }
};

// For autograd::grad(): the nodes from which a capture can be reached.
void mark_paths(Pass& pass, const std::vector<Node*>& roots) {
  std::unordered_map<Node*, bool> reaches;
  // Iterative post-order: a node reaches a capture if it is one or a child reaches one.
  for (Node* root : roots) {
    std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next == 0 && reaches.count(n)) {
        stack.pop_back();
        continue;
      }
      if (next < n->next_edges.size()) {
        const Edge& e = n->next_edges[next++];
        if (e.valid() && !reaches.count(e.fn.get())) stack.push_back({e.fn.get(), 0});
        continue;
      }
      bool r = false;
      for (size_t k = 0; k < n->outputs.size() && !r; k++) r = pass.captures.count({n, int(k)});
      for (const Edge& e : n->next_edges) r = r || (e.valid() && reaches[e.fn.get()]);
      reaches[n] = r;
      if (r) pass.on_path.insert(n);
      stack.pop_back();
    }
  }
}

void count_dependencies(Pass& pass, const std::vector<Node*>& roots) {
  std::unordered_set<Node*> seen(roots.begin(), roots.end());
  std::vector<Node*> stack;
  for (Node* r : roots)
    if (pass.runs(r)) stack.push_back(r);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid() || !pass.runs(e.fn.get())) continue;
      pass.dependencies[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
}

// Runs the pass from `roots` (edges with their gradients). Nodes are kept alive by the edges that
// reach them, which the roots' own shared_ptrs hold for the length of the pass.
void run(Pass& pass, const std::vector<Edge>& roots, std::vector<Tensor> root_grads,
         bool retain_graph) {
  NoGradGuard no_grad;  // a backward pass records nothing (no higher-order gradients yet)
  std::vector<Node*> root_nodes;
  for (const Edge& e : roots) root_nodes.push_back(e.fn.get());
  if (!pass.captures.empty()) mark_paths(pass, root_nodes);
  count_dependencies(pass, root_nodes);
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence < b->sequence;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>,
                      decltype(later_first)>
      ready(later_first);
  std::unordered_set<Node*> queued;
  auto buffer_of = [&](Node* n) -> std::vector<Tensor>& {
    auto& b = pass.buffers[n];
    if (b.empty()) b.resize(n->outputs.size());
    return b;
  };
  for (size_t i = 0; i < roots.size(); i++) {
    if (!pass.runs(roots[i].fn.get())) continue;
    accumulate(buffer_of(roots[i].fn.get()).at(size_t(roots[i].input_nr)),
               std::move(root_grads[i]));
    if (pass.dependencies[roots[i].fn.get()] == 0 && queued.insert(roots[i].fn.get()).second)
      ready.push(roots[i].fn);
  }
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffer_of(node.get()));
    pass.buffers.erase(node.get());
    for (auto& [k, weak] : node->retained)
      if (std::shared_ptr<Meta> m = weak.lock(); m && grads.at(size_t(k)).defined()) {
        std::lock_guard<std::mutex> lk(m->mu);
        accumulate_into(m->grad, grads[size_t(k)]);
      }
    for (size_t k = 0; k < grads.size(); k++) {
      auto c = pass.captures.find({node.get(), int(k)});
      if (c != pass.captures.end() && grads[k].defined())
        for (size_t index : c->second) pass.captured[index] = grads[k];
      if (!grads[k].defined())
        grads[k] = Tensor::zeros(node->outputs[k].shape, node->outputs[k].dtype);
    }
    if (!pass.accumulate_leaves && dynamic_cast<AccumulateGrad*>(node.get())) continue;
    std::vector<Tensor> out = node->apply(std::move(grads));
    if (!retain_graph) node->release();
    OPFORGE_CHECK(out.size() == node->next_edges.size())
        << "autograd: " << node->name() << " returned " << out.size() << " gradients for "
        << node->next_edges.size() << " inputs";
    for (size_t i = 0; i < out.size(); i++) {
      const Edge& e = node->next_edges[i];
      if (!e.valid() || !pass.runs(e.fn.get())) continue;
      if (out[i].defined())
        accumulate(buffer_of(e.fn.get()).at(size_t(e.input_nr)),
                   fit(std::move(out[i]), node->inputs[i], node->name(), i));
      if (--pass.dependencies[e.fn.get()] == 0 && queued.insert(e.fn.get()).second)
        ready.push(e.fn);
    }
  }
}

// The edges of the roots, and their gradients (ones for a one-element root without one).
void roots_of(const char* what, const std::vector<Tensor>& tensors,
              const std::vector<Tensor>& grads, std::vector<Edge>& edges,
              std::vector<Tensor>& root_grads) {
  OPFORGE_CHECK(grads.empty() || grads.size() == tensors.size())
      << what << ": " << grads.size() << " gradients for " << tensors.size() << " tensors";
  for (size_t i = 0; i < tensors.size(); i++) {
    const Tensor& t = tensors[i];
    OPFORGE_CHECK(t.defined()) << what << ": tensor " << i << " is undefined";
    Edge e = gradient_edge(t);
    OPFORGE_CHECK(e.valid()) << what << ": tensor " << i
                             << " does not require a gradient and has no grad_fn (made under "
                                "NoGradGuard, detached, or from inputs that need no gradient)";
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      OPFORGE_CHECK(t.numel() == 1)
          << what << ": tensor " << i << " of shape " << shape_str(t.shape())
          << " is not a single value: give its gradient (a tensor of the same shape)";
      g = Tensor::ones(t.shape(), t.dtype());
    }
    OPFORGE_CHECK(g.shape() == t.shape())
        << what << ": the gradient of tensor " << i << " has shape " << shape_str(g.shape())
        << ", the tensor has shape " << shape_str(t.shape());
    OPFORGE_CHECK(is_floating(g.dtype()))
        << what << ": gradients are floating, got " << describe(g.shape(), g.dtype());
    edges.push_back(e);
    g = g.detach();  // the caller's tensor, without its own history
    root_grads.push_back(g.dtype() == t.dtype() ? g : cast(g, t.dtype()));
  }
}
}  // namespace

bool grad_enabled() { return grad_mode; }
void set_grad_enabled(bool enabled) { grad_mode = enabled; }

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grads,
              bool retain_graph) {
  std::vector<Edge> edges;
  std::vector<Tensor> root_grads;
  roots_of("backward", tensors, grads, edges, root_grads);
  Pass pass;
  run(pass, edges, std::move(root_grads), retain_graph);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph,
                         bool allow_unused) {
  std::vector<Edge> edges;
  std::vector<Tensor> root_grads;
  roots_of("autograd::grad", outputs, grad_outputs, edges, root_grads);
  Pass pass;
  pass.accumulate_leaves = false;
  pass.captured.resize(inputs.size());
  std::vector<std::shared_ptr<Node>> keep;  // input accumulators made here live for the pass
  for (size_t i = 0; i < inputs.size(); i++) {
    OPFORGE_CHECK(inputs[i].defined()) << "autograd::grad: input " << i << " is undefined";
    Edge e = gradient_edge(inputs[i]);
    OPFORGE_CHECK(e.valid()) << "autograd::grad: input " << i << " does not require a gradient";
    keep.push_back(e.fn);
    pass.captures[{e.fn.get(), e.input_nr}].push_back(i);
  }
  run(pass, edges, std::move(root_grads), retain_graph);
  for (size_t i = 0; i < inputs.size(); i++) {
    Tensor& g = pass.captured[i];
    if (!g.defined()) {
      OPFORGE_CHECK(allow_unused)
          << "autograd::grad: input " << i
          << " is not used by the outputs' graph (pass allow_unused to get an undefined gradient)";
      continue;
    }
    g = fit(g, {inputs[i].shape(), inputs[i].dtype()}, "autograd::grad", i);
  }
  return pass.captured;
}

}  // namespace opforge::autograd
