// Tensor: a typed, strided view of reference-counted storage. Views (reshape, transpose, slice,
// expand) share storage and never copy; contiguous() copies only when the view is not dense. A
// tensor lives on the host (every CPU device reads it) or on a GPU device (to_device); ops on GPU
// tensors run on that GPU and return tensors there.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "opforge/device.hpp"
#include "opforge/dtype.hpp"
#include "opforge/error.hpp"
#include "opforge/small_vector.hpp"

namespace opforge {

using Shape = SmallVector<int64_t, 8>;  // dims or strides, outermost first; inline up to 8

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Seedable random source for rand/randn (mt19937_64 underneath, so a seed gives the same
// numbers on every platform).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x0f0f0f0f) : engine_(seed) {}
  void seed(uint64_t s) { engine_.seed(s); }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};
Generator& default_generator();

struct Storage;
namespace autograd {
class Node;
struct Meta;
}  // namespace autograd

class Tensor {
 public:
  Tensor() = default;

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::Float32);
  static Tensor ones(const Shape& shape, DType dtype = DType::Float32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::Float32);
  static Tensor scalar(double value, DType dtype = DType::Float32);
  static Tensor arange(double start, double stop, double step = 1, DType dtype = DType::Float32);
  static Tensor rand(const Shape& shape, DType dtype = DType::Float32,
                     Generator& g = default_generator());
  static Tensor randn(const Shape& shape, DType dtype = DType::Float32,
                      Generator& g = default_generator());
  // Copies `shape`'s element count of T from host memory.
  template <class T>
  static Tensor from_data(const T* data, const Shape& shape) {
    Tensor t = empty(shape, dtype_of_v<T>);
    t.copy_from_host(data, t.numel() * sizeof(T));
    return t;
  }
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape) {
    OPFORGE_CHECK(int64_t(v.size()) == shape_numel(shape))
        << "from_vector: " << v.size() << " values do not fill shape " << shape_str(shape);
    return from_data(v.data(), shape);
  }
  template <class T>
  static Tensor from_vector(const std::vector<T>& v) {
    return from_data(v.data(), {int64_t(v.size())});
  }

  // ---- properties ----
  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t offset() const { return offset_; }         // in elements
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;
  int64_t numel() const { return numel_; }
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype_); }
  // Where the tensor lives: cpu (host memory) or the GPU device it was moved to or computed on.
  Device device() const;
  // Address of element [0, ..., 0] in host memory, current once pending work is done. The caller
  // may write through it until the next op call that uses the tensor, so copies on GPU devices are
  // dropped (a GPU tensor stays there and is copied back when a GPU call next reads it).
  void* data() const;
  // The same address, for reading only: copies on GPU devices stay valid (PyTorch's
  // const_data_ptr).
  const void* const_data() const;
  // Waits for the queued calls that use this tensor and raises the error of the one that wrote
  // it if that failed, as reading it would, without copying it anywhere (a device's share of a
  // data-parallel step is timed up to its gradients).
  void wait() const;
  template <class T>
  T* data_ptr() const {
    check_type(dtype_of_v<T>);
    return static_cast<T*>(data());
  }

  // ---- views: share storage ----
  Tensor view(const Shape& shape) const;  // needs a layout that allows it
  Tensor reshape(
      const Shape& shape) const;  // view when possible, else a contiguous copy; -1 infers
  Tensor transpose(int d0, int d1) const;
  Tensor permute(const std::vector<int>& dims) const;
  Tensor expand(const Shape& shape) const;  // size-1 dims broadcast with stride 0
  Tensor slice(int d, int64_t start, int64_t stop, int64_t step = 1) const;  // Python semantics
  Tensor select(int d, int64_t index) const;
  Tensor squeeze(int d) const;
  Tensor unsqueeze(int d) const;
  Tensor flatten() const { return reshape({numel()}); }

  // ---- copies ----
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;  // cast; the same tensor if the dtype already matches
  // This tensor on device d: itself when it already lives there (any CPU device counts as the
  // host), else a copy there. Like PyTorch's tensor.to(device).
  Tensor to(const Device& d) const;
  Tensor cpu() const { return to(Device{}); }
  void copy_to_host(void* dst, size_t bytes) const;    // in row-major order
  void copy_from_host(const void* src, size_t bytes);  // this tensor must be contiguous
  template <class T>
  std::vector<T> to_vector() const {
    check_type(dtype_of_v<T>);
    std::vector<T> v(static_cast<size_t>(numel()));
    copy_to_host(v.data(), v.size() * sizeof(T));
    return v;
  }
  // Value of a one-element tensor, converted to double.
  double item() const;
  // Elements as double in row-major order, whatever the dtype (for tests and printing).
  std::vector<double> to_double_vector() const;
  std::string str() const;

  // ---- in place (PyTorch's methods): the result is written into this tensor, in its dtype ----
  // `other` broadcasts to this tensor's shape; a result this dtype cannot hold (a float into an
  // integer tensor) is refused, and so is an expanded (stride-0) tensor.
  Tensor& add_(const Tensor& other, double alpha = 1);  // this += alpha * other
  Tensor& add_(double other);
  Tensor& sub_(const Tensor& other, double alpha = 1);
  Tensor& sub_(double other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double other);
  Tensor& clamp_(double min, double max);
  Tensor& copy_(const Tensor& src);  // src broadcast and converted to this tensor's dtype
  Tensor& fill_(double value);
  Tensor& zero_();

  // ---- autograd (autograd.hpp) ----
  bool requires_grad() const;
  // Marks a leaf (a tensor no recorded op made) as one whose gradient backward() computes; only
  // floating tensors can require a gradient. Returns this tensor.
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;  // made by no recorded op
  // The gradient backward() added up: of a leaf that requires one, or of a tensor that called
  // retain_grad(); undefined until then. A handle: zero_() on it clears it in place.
  Tensor grad() const;
  void set_grad(const Tensor& g);  // undefined clears it (zero_grad(set_to_none))
  // A non-leaf keeps its gradient in grad() too (leaves always do).
  void retain_grad() const;
  // The op that made this tensor, null for a leaf; its name (e.g. "mul") for messages and tests.
  std::shared_ptr<autograd::Node> grad_fn() const;
  // autograd::backward({*this}, {gradient}, retain_graph); a one-element tensor needs no gradient
  // (an undefined one stands for 1).
  void backward() const;
  void backward(const Tensor& gradient, bool retain_graph = false) const;
  // The same data without history: shares storage (and so its version counter), needs no
  // gradient.
  Tensor detach() const;
  // Counts in-place writes to the storage; a tensor saved for backward that was written since is
  // an Error in backward (as PyTorch's version counter).
  uint32_t version() const;

  // ---- internal: the runtime builds tensors from parts ----
  Tensor(std::shared_ptr<Storage> s, DType d, Shape shape, Shape strides, int64_t offset);
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Null unless the tensor takes part in autograd; shared by the copies of this handle made after
  // it was set. History is not part of a tensor's value: an in-place write into a const handle
  // (copy_into) still gives it the write's history, so it can be set on a const tensor.
  const std::shared_ptr<autograd::Meta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<autograd::Meta> m) const { autograd_ = std::move(m); }

 private:
  void check_type(DType t) const;
  Tensor contiguous_where_it_lives() const;
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::Float32;
  Shape shape_, strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 1;  // of shape_, counted (and checked) once: the per-call path asks often
  mutable std::shared_ptr<autograd::Meta> autograd_;
};

Shape contiguous_strides(const Shape& shape);

// t.to(d); the name the unified-framework device API uses.
Tensor to_device(const Tensor& t, const Device& d);
Tensor to_device(const Tensor& t, std::string_view device);

}  // namespace opforge
