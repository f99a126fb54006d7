// The Module tree and the layers' initialisation (PyTorch's defaults).
#include "opforge/torch/nn.hpp"

#include <cmath>
#include <typeinfo>

#include "opforge/autograd.hpp"
#include "opforge/torch/optim.hpp"

namespace opforge::torch::nn {
namespace {
// Uniform in [-bound, bound), from g.
Tensor uniform(const Shape& shape, double bound, DType dtype, Generator& g) {
  return sub(mul(Tensor::rand(shape, dtype, g), 2 * bound), bound);
}

template <class Get>
void collect(const Module& m, const std::string& prefix, bool recurse, Get own,
             std::vector<std::pair<std::string, Tensor>>& out) {
  for (const auto& [name, t] : own(m)) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : m.named_children())
    collect(*child, prefix + name + ".", true, own, out);
}
}  // namespace

void Module::check_name(const std::string& name) const {
  OPFORGE_CHECK(!name.empty() && name.find('.') == std::string::npos)
      << this->name() << ": the name \"" << name << "\" is empty or has a '.'";
  auto taken = [&](const auto& list) {
    for (const auto& e : list)
      if (e.first == name) return true;
    return false;
  };
  OPFORGE_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_))
      << this->name() << ": the name \"" << name << "\" is already registered";
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name);
  OPFORGE_CHECK(t.defined() && is_floating(t.dtype()))
      << name << ": a parameter must be a defined floating tensor";
  t.requires_grad_();
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name);
  buffers_.emplace_back(name, t);
  return t;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect(
      *this, "", recurse, [](const Module& m) { return m.params_; }, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect(
      *this, "", recurse, [](const Module& m) { return m.buffers_; }, out);
  return out;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : named_parameters()) out.emplace(name, t);
  for (auto& [name, t] : named_buffers()) out.emplace(name, t);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::map<std::string, Tensor> own = state_dict();
  if (strict) {
    for (const auto& [name, t] : state)
      OPFORGE_CHECK(own.count(name))
          << "load_state_dict: unexpected entry \"" << name << "\" for this " << this->name();
    for (const auto& [name, t] : own)
      OPFORGE_CHECK(state.count(name))
          << "load_state_dict: entry \"" << name << "\" of this " << this->name() << " is missing";
  }
  // Every entry is checked before any is written: a refused load changes nothing.
  for (const auto& [name, t] : state) {
    auto it = own.find(name);
    if (it == own.end()) continue;
    OPFORGE_CHECK(t.defined() && t.shape() == it->second.shape())
        << "load_state_dict: entry \"" << name << "\" has shape "
        << (t.defined() ? shape_str(t.shape()) : "undefined") << ", the module's has "
        << shape_str(it->second.shape());
  }
  autograd::NoGradGuard no_grad;
  for (const auto& [name, t] : state)
    if (auto it = own.find(name); it != own.end()) it->second.copy_(t);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad(bool set_to_none) { optim::zero_grads(parameters(), set_to_none); }

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, DType dtype,
               Generator& g) {
  OPFORGE_CHECK(in_features > 0 && out_features > 0)
      << "Linear: features must be positive, got " << in_features << " -> " << out_features;
  double bound = 1 / std::sqrt(double(in_features));
  weight = register_parameter("weight", uniform({out_features, in_features}, bound, dtype, g));
  if (with_bias) bias = register_parameter("bias", uniform({out_features}, bound, dtype, g));
}

namespace {
// A convolution layer's weight and bias (undefined without one), initialised as PyTorch does:
// uniform in +-1/sqrt(fan_in), where fan_in is the weight's dim 1 times the kernel's area:
// in_channels / groups for Conv2d, out_channels / groups for ConvTranspose2d (`transposed`), whose
// weight is (in_channels, out_channels / groups, k, k).
std::pair<Tensor, Tensor> conv_parameters(const char* layer, int64_t in_channels,
                                          int64_t out_channels, int64_t kernel_size, int64_t groups,
                                          bool transposed, bool with_bias, DType dtype,
                                          Generator& g) {
  OPFORGE_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0 && groups > 0 &&
                in_channels % groups == 0 && out_channels % groups == 0)
      << layer << ": channels " << in_channels << " -> " << out_channels << ", kernel "
      << kernel_size << " and groups " << groups << " do not fit together";
  int64_t rows = transposed ? in_channels : out_channels,
          per_group = (transposed ? out_channels : in_channels) / groups;
  double bound = 1 / std::sqrt(double(per_group * kernel_size * kernel_size));
  Tensor weight = uniform({rows, per_group, kernel_size, kernel_size}, bound, dtype, g);
  return {weight, with_bias ? uniform({out_channels}, bound, dtype, g) : Tensor()};
}
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
               const Conv2dOptions& options, bool with_bias, DType dtype, Generator& g)
    : options_(options) {
  auto [w, b] = conv_parameters("Conv2d", in_channels, out_channels, kernel_size, options.groups,
                                false, with_bias, dtype, g);
  weight = register_parameter("weight", w);
  if (with_bias) bias = register_parameter("bias", b);
}

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                                 const ConvTranspose2dOptions& options, bool with_bias, DType dtype,
                                 Generator& g)
    : options_(options) {
  auto [w, b] = conv_parameters("ConvTranspose2d", in_channels, out_channels, kernel_size,
                                options.groups, true, with_bias, dtype, g);
  weight = register_parameter("weight", w);
  if (with_bias) bias = register_parameter("bias", b);
}

Dropout::Dropout(double p, Generator& g) : p_(p), g_(&g) {
  OPFORGE_CHECK(p >= 0 && p <= 1) << "Dropout: probability " << p << " is not in [0, 1]";
}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, DType dtype)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  if (elementwise_affine) {
    weight = register_parameter("weight", Tensor::ones(shape_, dtype));
    bias = register_parameter("bias", Tensor::zeros(shape_, dtype));
  }
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine,
                         DType dtype)
    : eps_(eps), momentum_(momentum) {
  OPFORGE_CHECK(num_features > 0) << "BatchNorm2d: num_features must be positive, got "
                                  << num_features;
  if (affine) {
    weight = register_parameter("weight", Tensor::ones({num_features}, dtype));
    bias = register_parameter("bias", Tensor::zeros({num_features}, dtype));
  }
  running_mean = register_buffer("running_mean", Tensor::zeros({num_features}, dtype));
  running_var = register_buffer("running_var", Tensor::ones({num_features}, dtype));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::Int64));
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> layers) {
  for (const auto& l : layers) push_back(l);
}

void Sequential::push_back(std::shared_ptr<Module> layer) {
  OPFORGE_CHECK(layer) << "Sequential: a layer is null";
  register_module(std::to_string(size()), std::move(layer));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  const auto& layers = named_children();
  for (size_t i = 0; i < layers.size(); i++) {
    Module& layer = *layers[i].second;
    // A Linear followed by a ReLU is one kernel, the ReLU applied as the product is stored (exact
    // types only: a subclass may change what forward does).
    if (i + 1 < layers.size() && typeid(layer) == typeid(Linear) &&
        typeid(*layers[i + 1].second) == typeid(ReLU)) {
      auto& lin = static_cast<Linear&>(layer);
      y = opforge::linear(y, lin.weight, lin.bias, Activation::relu);
      i++;
      continue;
    }
    y = layer.forward(y);
  }
  return y;
}

}  // namespace opforge::torch::nn
