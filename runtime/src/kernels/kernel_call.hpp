// Building the argument array of a generated kernel: Halide buffers over tensor views (dims
// innermost first), attributes converted per the op's spec, and the dimension collapsing that
// maps an N-d strided call onto the family's canonical view.
#pragma once
#include <HalideRuntime.h>

#include <array>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <span>

#include "devices/backend.hpp"
#include "devices/gpu_memory.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/error.hpp"
#include "opforge/ops.hpp"
#include "opforge/registry.hpp"
#include "opforge/tensor.hpp"

namespace opforge::detail {

inline constexpr int kMaxDims = 6;

// The registry entry of a built-in op, looked up once per call site (a function-local static).
#define OPFORGE_OP(name)                                           \
  ([]() -> const ::opforge::OpInfo& {                              \
    static const ::opforge::OpInfo& op = ::opforge::op_info(name); \
    return op;                                                     \
  }())

inline halide_type_t halide_type_of(DType t) {
  switch (t) {
    case DType::Bool:
      return {halide_type_uint, 8, 1};
    case DType::Int32:
      return {halide_type_int, 32, 1};
    case DType::Int64:
      return {halide_type_int, 64, 1};
    case DType::Float32:
      return {halide_type_float, 32, 1};
    case DType::Float64:
      return {halide_type_float, 64, 1};
  }
  return {};
}

// A view in Halide's terms: extents and strides in elements, innermost first.
struct View {
  void* host = nullptr;
  size_t offset_bytes = 0;  // of element [0, ...] in its storage
  DType dtype = DType::Float32;
  int n = 0;
  // Only the first n are read; whoever makes a view sets them (collapse sets all kMaxDims).
  int64_t extent[kMaxDims];
  int64_t stride[kMaxDims];
  std::shared_ptr<Storage> storage;  // kept alive, and ordered, until the kernel has run
  // Points the view at t's element [0, ...] (extents and strides are set by the caller).
  View& bind(const Tensor& t);
};

// This thread's latest Halide error message, cleared (the handler is installed on first use).
std::string take_halide_error();

// Address of t's element [0, ...] without waiting for pending work: kernels are ordered by the
// events their storages carry, so only host reads go through Tensor::data().
void* address(const Tensor& t);

// The tensor's dims reversed (innermost first); rank 0 becomes one dim of extent 1.
View view_of(const Tensor& t);
// A view of a contiguous tensor with the given extents (innermost first).
View dense_view(const Tensor& t, std::initializer_list<int64_t> extents);

// The arguments of one kernel call. Argument 0 is its Halide user context (a UserContext: the
// logical CPU device's pool, the OpenCL device), set by launch(). Buffers are given in the kernel's
// declared order, each with its role; argv() lays them out as kernel_abi.hpp says (read buffers,
// scalars, written buffers; an inout buffer twice). The object may be moved into a device queue:
// argv() builds the pointer array where the object finally lives.
class KernelArgs {
 public:
  KernelArgs() {}
  // A contiguous tensor of n elements as the six-dimensional kernels' flat view (what collapse()
  // makes of it), without building a View.
  void flat(const Tensor& t, int64_t n, BufferRole role);
  void input(View v) { add(v, BufferRole::input); }
  void output(View v) { add(v, BufferRole::output); }
  void inout(View v) { add(v, BufferRole::inout); }
  void attrs(const OpInfo& op, std::span<const double> values);
  void attrs(const OpInfo& op, std::initializer_list<double> values) {
    attrs(op, std::span<const double>(values.begin(), values.size()));
  }
  // The device's user context (a UserContext, null: the plain cpu); each call carries a copy of
  // its own, with the call's slot for Halide's error text.
  void set_context(void* device_context) {
    ctx_ = device_context ? *static_cast<UserContext*>(device_context) : UserContext{};
  }
  std::string* error_slot() { return &error_; }
  void** argv();
  // The entry point of k that runs this call: its dense companion (kernel_abi.hpp) when it has one
  // and every buffer is contiguous, with the buffers passed as one-dimensional; else its strided
  // kernel, with the buffers at their full rank.
  KernelEntry entry_for(const KernelVariant& k);
  int num_buffers() const { return nb_; }
  // Every buffer is contiguous: a variant with a dense companion runs that (entry_for).
  bool dense() const { return dense_; }
  BufferRole role(int b) const { return roles_[size_t(b)]; }
  bool reads(int b) const { return opforge::reads(roles_[size_t(b)]); }
  bool writes(int b) const { return opforge::writes(roles_[size_t(b)]); }
  // The first buffer the kernel writes.
  int first_written() const;
  halide_buffer_t* halide_buffer(int i) { return &bufs_[size_t(i)].b; }
  // The buffer's storage, which the caller's tensors keep alive while the call runs inline.
  Storage* storage(int buffer) const { return storages_[size_t(buffer)]; }
  // Before the call outlives its caller (a device queue): takes a reference to every storage.
  void retain();
  std::shared_ptr<Storage> owned(int buffer) const {
    return owned_ ? (*owned_)[size_t(buffer)] : nullptr;
  }
  // Refuses buffers that do not match the group's contract (count, role, dtype, rank), naming the
  // op and the buffer: a call with the wrong buffers would read or write the wrong memory.
  void check(const KernelGroup& g) const;

  // Before a host kernel runs: brings stale host copies up to date and points the buffers at them.
  // Notes whether any buffer has GPU copies, which host_done() then marks stale.
  void prepare_host();
  // After it ran: the written buffers' GPU copies are stale.
  void host_done();
  // Before a kernel runs on `mem`'s device: brings the storages' copies there up to date (copying
  // what is stale) and points the buffers at them. A view OpenCL cannot address in place runs on
  // a dense copy of its span.
  void prepare_device(DeviceMemory& mem);
  // After it ran (and the device finished): writes staged outputs back and marks the written
  // storages' other copies stale. Either way, gives the dense copies back.
  void device_done(DeviceMemory& mem, bool ran);

 private:
  void add(View& v, BufferRole role);  // takes v's storage
  struct Buf;
  // Claims the next buffer slot and sets all but its dims.
  Buf& next_buffer(BufferRole role, Storage* storage, size_t offset, void* host, DType dtype,
                   int rank);
  [[noreturn]] static void refuse_large(const View& v);
  enum class Slot : uint8_t { f64, i32 };
  static constexpr size_t kBufs = size_t(kMaxKernelBuffers);
  // Left uninitialised until add() sets them: zeroing every slot's dims on each call cost more
  // than the rest of building the arguments.
  struct Buf {
    Buf() {}
    halide_buffer_t b;
    union {
      halide_dimension_t d[kMaxDims];
    };
  };
  std::array<Buf, kBufs> bufs_;  // set by add(), only those used
  // What follows is set per buffer by add() and read only for the first nb_: the wide arrays are
  // not zeroed up front (the object is built on every call); enums and flags are, since copying an
  // invalid one is undefined.
  std::array<BufferRole, kBufs> roles_{};
  std::array<uint8_t, kBufs> ranks_;
  bool dense_ = true;          // every buffer so far is contiguous
  bool host_on_gpus_ = false;  // set by prepare_host()
  std::array<Storage*, kBufs> storages_;
  // References taken by add() (a view's) and retain(): an inline call on tensors the caller holds
  // needs none, which spares it an atomic count per buffer.
  std::optional<std::array<std::shared_ptr<Storage>, kBufs>> owned_;
  std::array<size_t, kBufs> offsets_;  // bytes
  // A GPU call's: set by prepare_device().
  union {
    std::array<DeviceHandle, kBufs> handles_;  // device handles, set by bind()
  };
  std::array<DeviceBlock*, kBufs> staged_;  // dense copies of views it cannot address
  std::array<bool, kBufs> pinned_{};        // storages whose device copy it pinned
  // Set before they are read: the scalars by attrs(), the pointers by argv().
  std::array<double, 8> f_;
  std::array<int32_t, 8> i_;
  std::array<Slot, 8> slots_;  // the scalars in the op's attribute order
  std::array<void*, 1 + 2 * kBufs + 8> args_;
  UserContext ctx_;
  std::string error_;
  void* context_ = nullptr;  // &ctx_, set by argv()
  int nb_ = 0, nf_ = 0, ni_ = 0, ns_ = 0;
};

// Runs one kernel of the group: the scheduler chooses the device and the variant, and the call runs
// on the caller's thread or on the chosen device's queue, after the calls it depends on.
void launch(const KernelGroup& g, const CallExtents& extents, KernelArgs&& args);

// Up to kMaxKernelBuffers tensors held inline: a call's inputs or results without a heap
// allocation.
class TensorList {
 public:
  static constexpr size_t kCapacity = size_t(kMaxKernelBuffers);
  TensorList() = default;
  explicit TensorList(std::span<const Tensor> t) {
    for (const Tensor& x : t) push_back(x);
  }
  TensorList(std::initializer_list<Tensor> t)
      : TensorList(std::span<const Tensor>(t.begin(), t.size())) {}
  TensorList(const TensorList& o) : TensorList(o.span()) {}
  TensorList(TensorList&& o) noexcept {
    for (Tensor& x : o) new (&slot(n_++)) Tensor(std::move(x));
    o.clear();
  }
  TensorList& operator=(const TensorList&) = delete;
  ~TensorList() { clear(); }
  void push_back(Tensor t) {
    OPFORGE_CHECK(n_ < kCapacity) << "a kernel takes at most " << kCapacity << " tensors";
    new (&slot(n_++)) Tensor(std::move(t));
  }
  void clear() {
    for (Tensor& x : *this) x.~Tensor();
    n_ = 0;
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  Tensor& operator[](size_t i) { return slot(i); }
  const Tensor& operator[](size_t i) const { return slot(i); }
  Tensor* begin() { return &slot(0); }
  Tensor* end() { return &slot(0) + n_; }
  const Tensor* begin() const { return &slot(0); }
  const Tensor* end() const { return &slot(0) + n_; }
  std::span<const Tensor> span() const { return {begin(), n_}; }
  std::vector<Tensor> vector() const { return {begin(), end()}; }

 private:
  // Slots are constructed only when used: a call rarely has more than three tensors.
  Tensor& slot(size_t i) {
    return *std::launder(reinterpret_cast<Tensor*>(raw_ + i * sizeof(Tensor)));
  }
  const Tensor& slot(size_t i) const {
    return *std::launder(reinterpret_cast<const Tensor*>(raw_ + i * sizeof(Tensor)));
  }
  alignas(Tensor) unsigned char raw_[kCapacity * sizeof(Tensor)];
  size_t n_ = 0;
};

// Merges adjacent dims of same-shaped views where every view allows it (strides nest), and drops
// size-1 dims, then pads to exactly kMaxDims dims. Returns false if more than kMaxDims remain.
bool collapse(const Shape& shape, std::span<const Shape* const> strides, std::span<View> views);

// Output shape of NumPy broadcasting; the error names the op and the shapes.
Shape broadcast_shapes(const char* op, std::span<const Tensor> inputs);
Shape broadcast_shapes(const char* op, const std::vector<Shape>& shapes);

CallExtents extents_of(const View& v);

// Runs a one-input 6-D strided kernel (copy, cast) from src to dst, same shape, any strides. With
// more independent strides than one kernel takes, it makes one call per slice of the outer dim.
void run_strided(const KernelGroup& g, const Tensor& src, const Tensor& dst);
CallExtents extents(std::initializer_list<int64_t> e);

int wrap_axis(const char* op, int axis, int rank);

// The byte ranges two tensors span in one storage intersect (false for different storages).
bool may_overlap(const Tensor& a, const Tensor& b);
// Same storage, offset, shape and strides: a pointwise kernel may read and write it in place.
bool same_view(const Tensor& a, const Tensor& b);
// Before an op writes into an existing tensor (out=, in place): refuses a destination in which
// several elements share one address (an expanded, stride-0 view), as PyTorch does, since what
// such a write leaves behind depends on the order of the writes; and counts the write in its
// storage's version (autograd.hpp).
void begin_write(const char* op, const Tensor& dst);

// A result made without a kernel (empty, or a constant) goes where a kernel's would have: to the
// GPU device an input lives on, if any.
Tensor place_like(const Tensor& out, const std::vector<Tensor>& inputs);

}  // namespace opforge::detail
