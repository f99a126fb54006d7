// Halide buffers over tensors, attribute conversion and dimension collapsing.
#include "kernels/kernel_call.hpp"

#include <climits>
#include <cmath>
#include <sstream>

#include "core/storage.hpp"
#include "devices/gpu_memory.hpp"

namespace opforge::detail {

void* address(const Tensor& t) {
  OPFORGE_CHECK(t.defined()) << "tensor is undefined (default-constructed)";
  // A GPU tensor has no host memory until the host reads it: host kernels get theirs at run time.
  char* base = static_cast<char*>(t.storage()->ptr.load(std::memory_order_relaxed));
  return base ? base + t.offset() * int64_t(t.element_size()) : nullptr;
}

View& View::bind(const Tensor& t) {
  host = t.numel() ? address(t) : nullptr;
  offset_bytes = size_t(t.offset()) * t.element_size();
  dtype = t.dtype();
  storage = t.storage();
  return *this;
}

View view_of(const Tensor& t) {
  View v;
  v.bind(t);
  v.n = std::max(t.dim(), 1);
  OPFORGE_CHECK(t.dim() <= kMaxDims) << "internal: view of rank " << t.dim();
  if (t.dim() == 0) {
    v.extent[0] = 1;
    v.stride[0] = 1;
  }
  for (int i = 0; i < t.dim(); i++) {
    v.extent[i] = t.shape()[t.dim() - 1 - i];
    v.stride[i] = t.strides()[t.dim() - 1 - i];
    // A size-1 dim's stride addresses nothing, but kernels check it (dim 0 must be 1).
    if (v.extent[i] == 1) v.stride[i] = i == 0 ? 1 : v.stride[i - 1] * v.extent[i - 1];
  }
  return v;
}

View dense_view(const Tensor& t, std::initializer_list<int64_t> extents) {
  View v;
  v.bind(t);
  int64_t s = 1;
  for (auto e : extents) {
    v.extent[v.n] = e;
    v.stride[v.n] = s;
    s *= e;
    v.n++;
  }
  return v;
}

KernelArgs::Buf& KernelArgs::next_buffer(BufferRole role, Storage* storage, size_t offset,
                                         void* host, DType dtype, int rank) {
  OPFORGE_CHECK(nb_ < int(bufs_.size())) << "a kernel takes at most " << bufs_.size() << " tensors";
  roles_[size_t(nb_)] = role;
  storages_[size_t(nb_)] = storage;
  offsets_[size_t(nb_)] = offset;
  ranks_[size_t(nb_)] = uint8_t(rank);
  Buf& b = bufs_[size_t(nb_++)];
  b.b.device = 0;
  b.b.device_interface = nullptr;
  b.b.host = static_cast<uint8_t*>(host);
  b.b.flags = 0;
  b.b.type = halide_type_of(dtype);
  b.b.dimensions = rank;
  b.b.dim = b.d;
  b.b.padding = nullptr;
  return b;
}

void KernelArgs::add(View& v, BufferRole role) {
  OPFORGE_CHECK(nb_ < int(bufs_.size())) << "a kernel takes at most " << bufs_.size() << " tensors";
  if (!owned_) owned_.emplace();
  std::shared_ptr<Storage>& own = (*owned_)[size_t(nb_)];
  own = std::move(v.storage);
  Buf& b = next_buffer(role, own.get(), v.offset_bytes, v.host, v.dtype, v.n);
  // The kernels are compiled without Halide's large_buffers: each buffer's extents, strides and
  // element count must stay below 2^31. Refused here, before Halide would wrap an index.
  // Branch-free: the element count saturates at 2^31, so that it cannot overflow.
  constexpr int64_t kLimit = int64_t(1) << 31;
  int64_t elements = 1;
  bool fits = true, dense = v.stride[0] == 1;  // the dense entry's buffers are unit-strided
  for (int i = 0; i < v.n; i++) {
    const int64_t e = v.extent[i], st = v.stride[i];
    fits &= (e < kLimit) & (st == int64_t(int32_t(st)));
    elements = std::min(elements * std::clamp<int64_t>(e, 1, kLimit), kLimit);
    dense &= (i == 0) | (e == 1);
    b.d[i] = {0, int32_t(e), int32_t(st), 0};
  }
  fits &= elements < kLimit;
  dense_ = dense_ && dense;
  if (!fits) refuse_large(v);
}

void KernelArgs::flat(const Tensor& t, int64_t n, BufferRole role) {
  if (n > INT32_MAX) {
    View v;
    v.n = 1;
    v.extent[0] = n;
    v.stride[0] = 1;
    refuse_large(v);
  }
  Buf& b = next_buffer(role, t.storage().get(), size_t(t.offset()) * t.element_size(), address(t),
                       t.dtype(), kMaxDims);
  b.d[0] = {0, int32_t(n), 1, 0};
  for (int i = 1; i < kMaxDims; i++) b.d[i] = {0, 1, int32_t(n), 0};
}

void KernelArgs::retain() {
  if (!owned_) owned_.emplace();
  for (int b = 0; b < nb_; b++)
    if (std::shared_ptr<Storage>& own = (*owned_)[size_t(b)]; storages_[size_t(b)] && !own)
      own = storages_[size_t(b)]->shared_from_this();
}

KernelEntry KernelArgs::entry_for(const KernelVariant& k) {
  bool dense = dense_ && k.dense_argv;
  for (int b = 0; b < nb_; b++) bufs_[size_t(b)].b.dimensions = dense ? 1 : ranks_[size_t(b)];
  return dense ? k.dense_argv : k.argv;
}

int KernelArgs::first_written() const {
  for (int b = 0; b < nb_; b++)
    if (writes(b)) return b;
  return -1;
}

void KernelArgs::refuse_large(const View& v) {
  int64_t elements = 1;
  for (int i = 0; i < v.n; i++) {
    OPFORGE_CHECK(v.extent[i] <= INT32_MAX && v.stride[i] <= INT32_MAX && v.stride[i] >= INT32_MIN)
        << "tensor dimension " << v.extent[i] << " (stride " << v.stride[i]
        << ") exceeds the 2^31 limit of generated kernels";
    elements *= std::max<int64_t>(v.extent[i], 1);
    OPFORGE_CHECK(elements <= INT32_MAX)
        << "a tensor of " << elements << "+ elements in one kernel call exceeds the 2^31-element "
        << "limit of generated kernels (they are built without Halide's large_buffers)";
  }
  throw Error("internal: a buffer was refused as too large, but every dimension fits");
}

namespace {
DType dtype_of_halide(const halide_type_t& t) {
  if (t.code == halide_type_float) return t.bits == 32 ? DType::Float32 : DType::Float64;
  if (t.code == halide_type_uint) return DType::Bool;
  return t.bits == 32 ? DType::Int32 : DType::Int64;
}
}  // namespace

void KernelArgs::check(const KernelGroup& g) const {
  // The per-call path compares; only a mismatch builds a message.
  bool ok = size_t(nb_) == g.buffers.size();
  for (int b = 0; ok && b < nb_; b++) {
    const BufferSpec& want = g.buffers[size_t(b)];
    ok = roles_[size_t(b)] == want.role && bufs_[size_t(b)].b.type == halide_type_of(want.dtype) &&
         bufs_[size_t(b)].b.dimensions == want.dims;
  }
  if (ok) return;
  const std::string& op = g.op->name;
  OPFORGE_CHECK(size_t(nb_) == g.buffers.size())
      << op << " (" << g.dtype_key << "): the call passes " << nb_ << " buffers, the kernel takes "
      << g.buffers.size();
  for (int b = 0; b < nb_; b++) {
    const BufferSpec& want = g.buffers[size_t(b)];
    const halide_buffer_t& got = bufs_[size_t(b)].b;
    OPFORGE_CHECK(roles_[size_t(b)] == want.role)
        << op << " (" << g.dtype_key << "): buffer " << b << " (" << want.name << ") is passed as "
        << role_name(roles_[size_t(b)]) << ", the kernel declares it " << role_name(want.role);
    OPFORGE_CHECK(dtype_of_halide(got.type) == want.dtype)
        << op << " (" << g.dtype_key << "): buffer " << b << " (" << want.name << ") is "
        << dtype_name(dtype_of_halide(got.type)) << ", expected " << dtype_name(want.dtype);
    OPFORGE_CHECK(got.dimensions == want.dims)
        << op << " (" << g.dtype_key << "): buffer " << b << " (" << want.name << ") has rank "
        << got.dimensions << ", expected " << want.dims;
  }
}

void** KernelArgs::argv() {
  size_t a = 0;
  ctx_.error = &error_;
  context_ = &ctx_;
  args_[a++] = &context_;
  for (int b = 0; b < nb_; b++)
    if (reads(b)) {
      bufs_[size_t(b)].b.dim = bufs_[size_t(b)].d;
      args_[a++] = &bufs_[size_t(b)].b;
    }
  for (int k = 0, nf = 0, ni = 0; k < ns_; k++)
    args_[a++] = slots_[size_t(k)] == Slot::f64 ? static_cast<void*>(&f_[size_t(nf++)])
                                                : static_cast<void*>(&i_[size_t(ni++)]);
  for (int b = 0; b < nb_; b++)
    if (writes(b)) {
      bufs_[size_t(b)].b.dim = bufs_[size_t(b)].d;
      args_[a++] = &bufs_[size_t(b)].b;
    }
  return args_.data();
}

void KernelArgs::prepare_host() {
  host_on_gpus_ = false;
  for (int b = 0; b < nb_; b++) {
    Storage* st = storages_[size_t(b)];
    if (!st || !st->on_gpus()) continue;
    host_on_gpus_ = true;
    if (bufs_[size_t(b)].b.size_in_bytes() == 0) continue;
    halide_buffer_t& hb = bufs_[size_t(b)].b;
    hb.host = static_cast<uint8_t*>(st->host_current()) + offsets_[size_t(b)];
    // Where a GPU try failed before, the buffer still names its device copy.
    hb.device = 0;
    hb.device_interface = nullptr;
    hb.flags = 0;
  }
}

void KernelArgs::host_done() {
  if (!host_on_gpus_) return;
  for (int b = 0; b < nb_; b++)
    if (Storage* out = storages_[size_t(b)]; writes(b) && out && out->on_gpus())
      out->host_written();
}

void KernelArgs::prepare_device(DeviceMemory& mem) {
  staged_.fill(nullptr);
  pinned_.fill(false);
  for (int b = 0; b < nb_; b++) {
    Storage* st = storages_[size_t(b)];
    halide_buffer_t& hb = bufs_[size_t(b)].b;
    size_t span = hb.size_in_bytes(), off = offsets_[size_t(b)];
    // An output (not inout) that densely covers its whole storage, which no other buffer shares,
    // needs nothing copied there first.
    bool overwrite = roles_[size_t(b)] == BufferRole::output && off == 0 && span == st->bytes &&
                     size_t(hb.number_of_elements()) * hb.type.bytes() == span;
    for (int i = 0; overwrite && i < nb_; i++) overwrite = i == b || storages_[size_t(i)] != st;
    DeviceBlock& block = st->device_current(mem, overwrite, true);
    pinned_[size_t(b)] = true;
    hb.host = nullptr;
    hb.flags = 0;
    if (mem.bind(hb, block, off, handles_[size_t(b)])) continue;
    DeviceBlock* dense = mem.allocate(span);
    staged_[size_t(b)] = dense;
    mem.copy(block, off, *dense, 0, span);
    mem.bind(hb, *dense, 0, handles_[size_t(b)]);
  }
}

void KernelArgs::device_done(DeviceMemory& mem, bool ran) {
  auto release_staged = [&] {
    for (int b = 0; b < nb_; b++)
      if (DeviceBlock*& dense = staged_[size_t(b)]) {
        mem.release(dense);
        dense = nullptr;
      }
  };
  auto unpin_all = [&] {
    for (int b = 0; b < nb_; b++)
      if (pinned_[size_t(b)]) {
        storages_[size_t(b)]->unpin(mem);
        pinned_[size_t(b)] = false;
      }
  };
  int failed_at = nb_;
  try {
    for (int b = 0; b < nb_ && ran; b++)
      if (DeviceBlock* dense = staged_[size_t(b)]; dense && writes(b)) {
        failed_at = b;
        mem.copy(*dense, 0, storages_[size_t(b)]->device_current(mem, false), offsets_[size_t(b)],
                 bufs_[size_t(b)].b.size_in_bytes());
      }
  } catch (...) {
    release_staged();
    unpin_all();
    for (int b = 0; b < nb_; b++)
      if (writes(b)) {
        // Outputs copied back before the failure are whole; the rest are not.
        if (b < failed_at)
          storages_[size_t(b)]->device_written(mem);
        else
          storages_[size_t(b)]->device_failed(mem);
      }
    throw;
  }
  release_staged();
  unpin_all();
  // A failed call may have written part of a device copy: only the host's is trustworthy.
  for (int b = 0; b < nb_; b++)
    if (writes(b)) {
      if (ran)
        storages_[size_t(b)]->device_written(mem);
      else
        storages_[size_t(b)]->device_failed(mem);
    }
}

void KernelArgs::attrs(const OpInfo& op, std::span<const double> values) {
  OPFORGE_CHECK(values.size() == op.attrs.size())
      << op.name << ": expected " << op.attrs.size() << " attribute(s), got " << values.size();
  OPFORGE_CHECK(size_t(ns_) + values.size() <= slots_.size())
      << op.name << ": a kernel takes at most " << slots_.size() << " attributes";
  for (size_t i = 0; i < values.size(); i++) {
    if (op.attrs[i].integer) {
      OPFORGE_CHECK(values[i] >= INT32_MIN && values[i] <= INT32_MAX &&
                    values[i] == std::floor(values[i]))
          << op.name << ": attribute " << op.attrs[i].name << " must be a 32-bit integer, got "
          << values[i];
      i_[size_t(ni_++)] = int32_t(values[i]);
      slots_[size_t(ns_++)] = Slot::i32;
    } else {
      f_[size_t(nf_++)] = values[i];
      slots_[size_t(ns_++)] = Slot::f64;
    }
  }
}

bool collapse(const Shape& shape, std::span<const Shape* const> strides, std::span<View> views) {
  int r = int(shape.size());
  for (auto& v : views) v.n = 0;
  int n = 0;
  int64_t group_extent = 0;
  for (int d = r - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (size_t k = 0; merge && k < views.size(); k++)
      merge = (*strides[k])[d] == views[k].stride[n - 1] * group_extent;
    if (merge) {
      group_extent *= shape[d];
      for (auto& v : views) v.extent[n - 1] = group_extent;
      continue;
    }
    if (n == kMaxDims) return false;
    group_extent = shape[d];
    for (size_t k = 0; k < views.size(); k++) {
      views[k].extent[n] = shape[d];
      views[k].stride[n] = (*strides[k])[d];
    }
    n++;
  }
  // The 6-D kernels take exactly kMaxDims dims: pad with size-1 dims.
  for (auto& v : views) {
    for (int i = n; i < kMaxDims; i++) {
      v.extent[i] = 1;
      v.stride[i] = i == 0 ? 1 : v.stride[i - 1] * v.extent[i - 1];
    }
    v.n = kMaxDims;
  }
  return true;
}

namespace {
// NumPy broadcasting over any list of shapes; shape_of(k) is the k-th. Builds nothing but the
// result (the per-call path); the error names every shape.
template <class ShapeOf>
Shape broadcast(const char* op, size_t n, const ShapeOf& shape_of) {
  size_t rank = 0;
  for (size_t k = 0; k < n; k++) rank = std::max(rank, shape_of(k).size());
  Shape out(rank, 1);
  for (size_t k = 0; k < n; k++) {
    const Shape& s = shape_of(k);
    size_t lead = rank - s.size();
    for (size_t i = 0; i < s.size(); i++) {
      int64_t& o = out[lead + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o == 1) {
        o = s[i];
        continue;
      }
      std::ostringstream shapes;
      for (size_t j = 0; j < n; j++) shapes << (j ? " and " : "") << shape_str(shape_of(j));
      OPFORGE_CHECK(false) << op << ": cannot broadcast shapes " << shapes.str() << ": argument "
                           << k << " has size " << s[i] << " in dimension " << lead + i << " where "
                           << o << " is expected (or 1)";
    }
  }
  return out;
}
}  // namespace

Shape broadcast_shapes(const char* op, std::span<const Tensor> inputs) {
  return broadcast(op, inputs.size(), [&](size_t k) -> const Shape& { return inputs[k].shape(); });
}

Shape broadcast_shapes(const char* op, const std::vector<Shape>& inputs) {
  return broadcast(op, inputs.size(), [&](size_t k) -> const Shape& { return inputs[k]; });
}

CallExtents extents_of(const View& v) {
  CallExtents c;
  c.n = kMaxDims;
  for (int i = 0; i < kMaxDims; i++) c.e[i] = i < v.n ? v.extent[i] : 1;
  return c;
}

void run_strided(const KernelGroup& g, const Tensor& src, const Tensor& dst) {
  const Shape* strides[] = {&src.strides(), &dst.strides()};
  View views[2];
  if (!collapse(dst.shape(), strides, views)) {
    for (int64_t i = 0; i < dst.size(0); i++) run_strided(g, src.select(0, i), dst.select(0, i));
    return;
  }
  KernelArgs args;
  args.input(views[0].bind(src));
  args.output(views[1].bind(dst));
  launch(g, extents_of(views[1]), std::move(args));
}

CallExtents extents(std::initializer_list<int64_t> e) {
  CallExtents c;
  for (auto x : e) c.e[c.n++] = x;
  return c;
}

Tensor place_like(const Tensor& out, const std::vector<Tensor>& inputs) {
  for (const Tensor& in : inputs)
    if (in.defined() && in.device().kind != DeviceKind::cpu) return out.to(in.device());
  return out;
}

int wrap_axis(const char* op, int axis, int rank) {
  int r = std::max(rank, 1);
  OPFORGE_CHECK(axis >= -r && axis < r)
      << op << ": axis " << axis << " is out of range for a tensor of rank " << rank
      << " (expected " << -r << " to " << r - 1 << ")";
  return axis < 0 ? axis + r : axis;
}

}  // namespace opforge::detail

namespace opforge::detail {

bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t, int64_t& lo, int64_t& hi) {
    lo = hi = t.offset() * int64_t(t.element_size());
    for (int d = 0; d < t.dim(); d++) {
      int64_t span = (t.shape()[d] - 1) * t.strides()[d] * int64_t(t.element_size());
      (span < 0 ? lo : hi) += span;
    }
    hi += int64_t(t.element_size()) - 1;
  };
  int64_t alo, ahi, blo, bhi;
  range(a, alo, ahi);
  range(b, blo, bhi);
  return alo <= bhi && blo <= ahi;
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.offset() != b.offset() || a.shape() != b.shape())
    return false;
  for (int d = 0; d < a.dim(); d++)
    if (a.shape()[d] != 1 && a.strides()[d] != b.strides()[d]) return false;
  return true;
}

void begin_write(const char* op, const Tensor& dst) {
  for (int d = 0; d < dst.dim(); d++)
    OPFORGE_CHECK(dst.strides()[d] != 0 || dst.shape()[d] <= 1)
        << op << ": the destination " << shape_str(dst.shape()) << " has stride 0 in dimension "
        << d
        << " (an expanded view), so several of its elements share one address; write into a "
           "tensor that owns its elements (clone() or contiguous() it first)";
  dst.storage()->version.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace opforge::detail
