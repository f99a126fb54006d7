// Tensor storage, views and host copies.
#include "opforge/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include "autograd/record.hpp"
#include "core/storage.hpp"
#include "devices/gpu_memory.hpp"
#include "opforge/ops.hpp"

namespace opforge {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); i++) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (auto d : s) overflow |= __builtin_mul_overflow(n, d, &n);
  OPFORGE_CHECK(!overflow) << "shape " << shape_str(s) << " has more than 2^63 elements";
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; i--) {
    st[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

bool parse_dtype(std::string_view name, DType& out) {
  struct Alias {
    std::string_view name;
    DType t;
  };
  static constexpr Alias aliases[] = {
      {"bool", DType::Bool},   {"int32", DType::Int32},   {"i32", DType::Int32},
      {"int64", DType::Int64}, {"i64", DType::Int64},     {"float32", DType::Float32},
      {"f32", DType::Float32}, {"float", DType::Float32}, {"float64", DType::Float64},
      {"f64", DType::Float64}, {"double", DType::Float64}};
  for (const auto& a : aliases)
    if (a.name == name) {
      out = a.t;
      return true;
    }
  return false;
}

Tensor::Tensor(std::shared_ptr<Storage> s, DType d, Shape shape, Shape strides, int64_t offset)
    : storage_(std::move(s)),
      dtype_(d),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      numel_(shape_numel(shape_)) {}

namespace {
void check_shape(const Shape& shape, const char* what) {
  for (auto d : shape)
    OPFORGE_CHECK(d >= 0) << what << ": shape " << shape_str(shape) << " has a negative dimension";
}
int wrap_dim(int d, int rank, const char* what) {
  OPFORGE_CHECK(rank > 0) << what << ": dimension " << d
                          << " given for a 0-d tensor, which has no dimensions";
  int r = rank;
  OPFORGE_CHECK(d >= -r && d < r) << what << ": dimension " << d
                                  << " is out of range for a tensor of rank " << rank
                                  << " (expected " << -r << " to " << r - 1 << ")";
  return d < 0 ? d + r : d;
}

template <class F>
void for_each_value(DType t, void* p, int64_t n, F&& f) {
  switch (t) {
    case DType::Bool:
      for (int64_t i = 0; i < n; i++) static_cast<uint8_t*>(p)[i] = f(i) != 0;
      break;
    case DType::Int32:
      for (int64_t i = 0; i < n; i++) static_cast<int32_t*>(p)[i] = int32_t(f(i));
      break;
    case DType::Int64:
      for (int64_t i = 0; i < n; i++) static_cast<int64_t*>(p)[i] = int64_t(f(i));
      break;
    case DType::Float32:
      for (int64_t i = 0; i < n; i++) static_cast<float*>(p)[i] = float(f(i));
      break;
    case DType::Float64:
      for (int64_t i = 0; i < n; i++) static_cast<double*>(p)[i] = f(i);
      break;
  }
}

double load_as_double(DType t, const char* p) {
  switch (t) {
    case DType::Bool:
      return *reinterpret_cast<const uint8_t*>(p);
    case DType::Int32:
      return *reinterpret_cast<const int32_t*>(p);
    case DType::Int64:
      return double(*reinterpret_cast<const int64_t*>(p));
    case DType::Float32:
      return *reinterpret_cast<const float*>(p);
    case DType::Float64:
      return *reinterpret_cast<const double*>(p);
  }
  return 0;
}

// Visits every element of a strided view in row-major order with its byte address.
template <class F>
void visit_strided(const Tensor& t, F&& f) {
  int64_t n = t.numel();
  if (n == 0) return;
  const char* base = static_cast<const char*>(t.const_data());
  size_t es = t.element_size();
  int r = t.dim();
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (int d = 0; d < r; d++) off += idx[d] * t.strides()[d];
    f(base + off * int64_t(es));
    for (int d = r - 1; d >= 0; d--) {
      if (++idx[d] < t.shape()[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  // Built in place (every result of every call comes from here): one pass counts the elements and
  // lays out the strides, innermost last.
  const size_t rank = shape.size();
  Tensor t;
  t.strides_.resize(rank);
  int64_t n = 1, stride = 1;
  bool negative = false, overflow = false, zero = false;
  for (size_t i = rank; i-- > 0;) {
    const int64_t d = shape[i];
    negative |= d < 0;
    zero |= d == 0;
    overflow |= __builtin_mul_overflow(n, d, &n);
    t.strides_[i] = stride;
    // Strides of a tensor with elements stay below its count; only a zero-element tensor's may
    // wrap, and nothing addresses them.
    __builtin_mul_overflow(stride, std::max<int64_t>(d, 1), &stride);
  }
  // A zero dim makes the count 0 whatever the others are (n ends at 0 once it meets it).
  if (negative || (overflow && !zero) || n > (int64_t(1) << 58)) {
    check_shape(shape, "empty");
    OPFORGE_CHECK(false) << "empty: shape " << shape_str(shape)
                         << " has more elements than any memory can hold";
  }
  t.storage_ = Storage::allocate(size_t(n) * dtype_size(dtype));
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  for_each_value(dtype, t.data(), t.numel(), [&](int64_t) { return value; });
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data(), 0, size_t(t.numel()) * t.element_size());
  return t;
}
Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1, dtype); }
Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor Tensor::arange(double start, double stop, double step, DType dtype) {
  OPFORGE_CHECK(std::isfinite(start) && std::isfinite(stop) && std::isfinite(step))
      << "arange: start, stop and step must be finite numbers, got " << start << ", " << stop
      << ", " << step;
  OPFORGE_CHECK(step != 0) << "arange: step must be non-zero";
  double count = std::ceil((stop - start) / step);
  OPFORGE_CHECK(std::isfinite(count) && count < 0x1p58)
      << "arange: [" << start << ", " << stop << ") in steps of " << step << " has " << count
      << " elements, more than any memory can hold";
  int64_t n = std::max<int64_t>(0, int64_t(count));
  Tensor t = empty({n}, dtype);
  for_each_value(dtype, t.data(), n, [&](int64_t i) { return start + double(i) * step; });
  return t;
}

Tensor Tensor::rand(const Shape& shape, DType dtype, Generator& g) {
  Tensor t = empty(shape, dtype);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  OPFORGE_CHECK(is_floating(dtype))
      << "rand: dtype " << dtype_name(dtype) << " is not a floating type";
  for_each_value(dtype, t.data(), t.numel(), [&](int64_t) { return u(g.engine()); });
  return t;
}

Tensor Tensor::randn(const Shape& shape, DType dtype, Generator& g) {
  Tensor t = empty(shape, dtype);
  std::normal_distribution<double> nd(0.0, 1.0);
  OPFORGE_CHECK(is_floating(dtype))
      << "randn: dtype " << dtype_name(dtype) << " is not a floating type";
  for_each_value(dtype, t.data(), t.numel(), [&](int64_t) { return nd(g.engine()); });
  return t;
}

int64_t Tensor::size(int d) const { return shape_[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t s = 1;
  for (int i = dim() - 1; i >= 0; i--) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Device Tensor::device() const { return storage_ ? storage_->home() : Device{}; }

void* Tensor::data() const {
  char* p = static_cast<char*>(const_cast<void*>(const_data()));
  storage_->host_written();
  return p;
}

void Tensor::wait() const {
  OPFORGE_CHECK(storage_) << "wait: tensor is undefined (default-constructed)";
  storage_->sync();
}

const void* Tensor::const_data() const {
  OPFORGE_CHECK(storage_) << "tensor is undefined (default-constructed)";
  storage_->sync();  // the host sees memory only after the device work that uses it is done
  return static_cast<const char*>(storage_->host_current()) + offset_ * int64_t(element_size());
}

Tensor Tensor::to(const Device& d) const {
  OPFORGE_CHECK(storage_) << "to: tensor is undefined (default-constructed)";
  OPFORGE_CHECK(device_exists(d)) << "to: no device " << d.str() << " on this machine";
  Device here = device();
  if (here == d || (d.kind == DeviceKind::cpu && here.kind == DeviceKind::cpu)) return *this;
  if (autograd::wants_grad({*this}))
    return autograd::differentiable(
        "to", {*this}, [&] { return to(d); },
        [&](const Tensor&) {
          return [home = device()](const std::vector<Tensor>& g) {
            return std::vector<Tensor>{g[0].to(home)};
          };
        });
  size_t bytes = size_t(numel()) * element_size();
  if (d.kind == DeviceKind::cpu) {
    Tensor out = empty(shape_, dtype_);
    copy_to_host(out.data(), bytes);
    return out;
  }
  detail::DeviceMemory* mem = detail::device_memory(d);
  OPFORGE_CHECK(mem) << "to: " << d.str()
                     << " holds no tensors in this build (it has no kernels for it)";
  Tensor c = contiguous_where_it_lives();
  const void* src = bytes ? c.const_data() : nullptr;
  Tensor out = empty(shape_, dtype_);
  Storage& st = *out.storage();
  st.adopt_home(d);
  mem->upload(st.device_current(*mem, true, true), src, bytes);  // pinned: no eviction meanwhile
  st.device_written(*mem);
  st.unpin(*mem);
  return out;
}

Tensor Tensor::contiguous_where_it_lives() const {
  Device here = device();
  if (here.kind == DeviceKind::cpu) return contiguous();
  // A GPU tensor's copy runs on its GPU whatever the default device.
  DefaultDevice scope(here);
  return contiguous();
}

Tensor to_device(const Tensor& t, const Device& d) { return t.to(d); }
Tensor to_device(const Tensor& t, std::string_view device) { return t.to(parse_device(device)); }

void Tensor::check_type(DType t) const {
  OPFORGE_CHECK(t == dtype_) << "tensor has dtype " << dtype_name(dtype_) << ", accessed as "
                             << dtype_name(t);
}

namespace {
Shape infer_shape(Shape shape, int64_t numel, const char* what) {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); i++) {
    if (shape[i] == -1) {
      OPFORGE_CHECK(infer < 0) << what << ": only one dimension can be -1, got "
                               << shape_str(shape);
      infer = int(i);
    } else {
      OPFORGE_CHECK(shape[i] >= 0)
          << what << ": invalid dimension " << shape[i] << " in " << shape_str(shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    OPFORGE_CHECK(known != 0 && numel % known == 0)
        << what << ": cannot infer -1 in " << shape_str(shape) << " for " << numel << " elements";
    shape[infer] = numel / known;
  }
  OPFORGE_CHECK(shape_numel(shape) == numel)
      << what << ": shape " << shape_str(shape) << " has " << shape_numel(shape)
      << " elements, the tensor has " << numel;
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible (the algorithm
// of PyTorch's computeStride: split the old dims into chunks that are contiguous in memory).
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape,
                  Shape& out) {
  out.assign(new_shape.size(), 0);
  if (shape_numel(old_shape) == 0 || old_shape.empty()) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = int64_t(old_shape.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

namespace {
// A view of `base`; when base wants a gradient, recorded with `backward` (the view's gradient to
// base's).
template <class Backward>
Tensor viewed(const Tensor& base, Tensor view, const char* name, Backward backward) {
  if (!autograd::wants_grad({base})) return view;
  autograd::record(
      name, std::span<const Tensor>(&base, 1), std::span<Tensor>(&view, 1),
      [backward](const std::vector<Tensor>& g) { return std::vector<Tensor>{backward(g[0])}; },
      true);
  return view;
}
// base's gradient from the gradient of the part `part_of` selects from it: zeros elsewhere.
template <class Part>
auto scatter_back(const Tensor& base, Part part_of) {
  return [shape = base.shape(), part_of](const Tensor& g) {
    Tensor z = Tensor::zeros(shape, g.dtype());
    copy_into(part_of(z), g);
    return z;
  };
}
auto reshape_back(const Tensor& base) {
  return [shape = base.shape()](const Tensor& g) { return g.reshape(shape); };
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "view");
  Shape st;
  OPFORGE_CHECK(view_strides(shape_, strides_, s, st))
      << "view: a tensor of shape " << shape_str(shape_) << " and strides " << shape_str(strides_)
      << " cannot be viewed as " << shape_str(s) << "; use reshape(), which copies";
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "view", reshape_back(*this));
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "reshape");
  Shape st;
  if (view_strides(shape_, strides_, s, st))
    return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "reshape", reshape_back(*this));
  return contiguous().view(s);  // both steps record
}

Tensor Tensor::transpose(int d0, int d1) const {
  std::vector<int> p(dim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[wrap_dim(d0, dim(), "transpose")], p[wrap_dim(d1, dim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  OPFORGE_CHECK(int(dims.size()) == dim())
      << "permute: got " << dims.size() << " dimensions for a tensor of rank " << dim();
  Shape s(dim()), st(dim());
  std::vector<bool> seen(dim(), false);
  for (int i = 0; i < dim(); i++) {
    int d = wrap_dim(dims[i], dim(), "permute");
    OPFORGE_CHECK(!seen[d]) << "permute: dimension " << d << " appears twice";
    seen[d] = true;
    s[i] = shape_[d];
    st[i] = strides_[d];
  }
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "permute",
                [dims](const Tensor& g) {
                  std::vector<int> inverse(dims.size());
                  for (size_t i = 0; i < dims.size(); i++)
                    inverse[size_t(wrap_dim(dims[i], int(dims.size()), "permute"))] = int(i);
                  return g.permute(inverse);
                });
}

Tensor Tensor::expand(const Shape& shape) const {
  OPFORGE_CHECK(shape.size() >= shape_.size())
      << "expand: cannot expand shape " << shape_str(shape_) << " to fewer dimensions "
      << shape_str(shape);
  size_t lead = shape.size() - shape_.size();
  Shape st(shape.size(), 0), s = shape;
  for (size_t i = 0; i < shape.size(); i++) {
    if (i < lead) {
      OPFORGE_CHECK(shape[i] >= 0) << "expand: invalid target " << shape_str(shape);
      continue;
    }
    int64_t have = shape_[i - lead];
    if (shape[i] == -1) s[i] = have;
    OPFORGE_CHECK(s[i] >= 0) << "expand: invalid size " << shape[i] << " in " << shape_str(shape);
    if (have == s[i]) {
      st[i] = strides_[i - lead];
    } else {
      OPFORGE_CHECK(have == 1) << "expand: dimension " << i - lead << " of shape "
                               << shape_str(shape_) << " has size " << have
                               << " and cannot be expanded to " << shape[i]
                               << " (only size-1 dimensions expand)";
    }
  }
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "expand",
                [shape = shape_](const Tensor& g) { return sum_to(g, shape); });
}

Tensor Tensor::slice(int d, int64_t start, int64_t stop, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  OPFORGE_CHECK(step > 0) << "slice: step must be positive, got " << step;
  int64_t n = shape_[d];
  // Python's clamping; written so that no index near the int64 limits overflows.
  auto clampi = [n](int64_t i) { return i < 0 ? (i < -n ? 0 : i + n) : std::min(i, n); };
  start = clampi(start);
  stop = clampi(stop);
  int64_t len = stop > start ? (stop - start - 1) / step + 1 : 0;
  Shape s = shape_, st = strides_;
  s[d] = len;
  st[d] =
      len > 1 ? detail::checked_mul("slice", "the step's stride", strides_[d], step) : strides_[d];
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_ + start * strides_[d]), "slice",
                scatter_back(*this, [d, start, stop, step](const Tensor& z) {
                  return z.slice(d, start, stop, step);
                }));
}

Tensor Tensor::select(int d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape_[d];
  OPFORGE_CHECK(index >= -n && index < n)
      << "select: index " << index << " is out of range for dimension " << d << " of size " << n;
  if (index < 0) index += n;
  Shape s = shape_, st = strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_ + index * strides_[d]), "select",
                scatter_back(*this, [d, index](const Tensor& z) { return z.select(d, index); }));
}

Tensor Tensor::squeeze(int d) const {
  if (dim() == 0) return *this;  // as PyTorch: squeezing a 0-d tensor is a no-op
  d = wrap_dim(d, dim(), "squeeze");
  if (shape_[d] != 1) return *this;
  Shape s = shape_, st = strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "squeeze", reshape_back(*this));
}

Tensor Tensor::unsqueeze(int d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape_, st = strides_;
  int64_t stride = d < dim() ? strides_[d] * shape_[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return viewed(*this, Tensor(storage_, dtype_, s, st, offset_), "unsqueeze", reshape_back(*this));
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  copy_into(out, *this);
  return out;
}

Tensor Tensor::to(DType d) const { return d == dtype_ ? *this : cast(*this, d); }

void Tensor::copy_to_host(void* dst, size_t bytes) const {
  size_t need = size_t(numel()) * element_size();
  OPFORGE_CHECK(bytes == need) << "copy_to_host: buffer of " << bytes << " bytes for a tensor of "
                               << need << " bytes";
  if (need == 0) return;
  if (is_contiguous()) {
    std::memcpy(dst, const_data(), need);
    return;
  }
  Tensor c = contiguous_where_it_lives();
  std::memcpy(dst, c.const_data(), need);
}

void Tensor::copy_from_host(const void* src, size_t bytes) {
  size_t need = size_t(numel()) * element_size();
  OPFORGE_CHECK(bytes == need) << "copy_from_host: " << bytes << " bytes for a tensor of " << need
                               << " bytes";
  OPFORGE_CHECK(is_contiguous())
      << "copy_from_host: the tensor must be contiguous; copy into contiguous() "
         "and use copy_into for views";
  if (need) std::memcpy(data(), src, need);
  storage_->version.fetch_add(1, std::memory_order_relaxed);
}

double Tensor::item() const {
  OPFORGE_CHECK(numel() == 1) << "item: tensor of shape " << shape_str(shape_) << " has " << numel()
                              << " elements, expected 1";
  return load_as_double(dtype_, static_cast<const char*>(const_data()));
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> v;
  v.reserve(size_t(numel()));
  visit_strided(*this, [&](const char* p) { v.push_back(load_as_double(dtype_, p)); });
  return v;
}

std::string Tensor::str() const {
  std::ostringstream os;
  os << "tensor(" << dtype_name(dtype_) << ", shape=" << shape_str(shape_) << ", [";
  auto v = to_double_vector();
  size_t shown = std::min<size_t>(v.size(), 16);
  for (size_t i = 0; i < shown; i++) os << (i ? ", " : "") << v[i];
  if (shown < v.size()) os << ", ...";
  os << "])";
  return os.str();
}

}  // namespace opforge
