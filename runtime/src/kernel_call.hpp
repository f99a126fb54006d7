// Building the argument array of a generated kernel: Halide buffers over tensor views (dims
// innermost first), attributes converted per the op's spec, and the dimension collapsing that
// maps an N-d strided call onto the family's canonical view.
#pragma once
#include <HalideRuntime.h>

#include <array>
#include <memory>

#include "gpu_devices.hpp"
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
  int64_t extent[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
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

// The arguments of one kernel call, in the generated kernel's order. Argument 0 is its Halide user
// context (a UserContext: the logical CPU device's pool, the OpenCL device), set by launch().
// Buffers are the inputs in order, then the output, which is always last. The object may be moved
// into a device queue: argv() builds the pointer array where the object finally lives.
class KernelArgs {
 public:
  void buffer(const View& v);
  void attrs(const OpInfo& op, const AttrValues& values);
  void set_context(void* ctx) { context_ = ctx; }
  void** argv();
  int num_buffers() const { return nb_; }
  halide_buffer_t* halide_buffer(int i) { return &bufs_[size_t(i)].b; }
  // Storages the call reads (every buffer but the last) and writes (the last).
  const std::shared_ptr<Storage>& storage(int buffer) const { return storages_[size_t(buffer)]; }

  // Before a host kernel runs: brings stale host copies up to date and points the buffers at them.
  void prepare_host();
  // After it ran: the output's GPU copies are stale.
  void host_done();
  // Before a kernel runs on `mem`'s device: brings the storages' copies there up to date (copying
  // what is stale) and points the buffers at them. A view OpenCL cannot address in place runs on
  // a dense copy of its span.
  void prepare_device(DeviceMemory& mem);
  // After it ran (and the device finished): writes a staged output back and marks the output's
  // other copies stale. Either way, gives the dense copies back.
  void device_done(DeviceMemory& mem, bool ran);

 private:
  enum class Slot : uint8_t { context, buffer, f64, i32 };
  struct Buf {
    halide_buffer_t b{};
    halide_dimension_t d[kMaxDims]{};
  };
  std::array<Buf, 6> bufs_{};
  std::array<std::shared_ptr<Storage>, 6> storages_{};
  std::array<size_t, 6> offsets_{};        // bytes
  std::array<DeviceHandle, 6> handles_{};  // a GPU call's device handles
  std::array<DeviceBlock*, 6> staged_{};   // a GPU call's dense copies of views it cannot address
  std::array<bool, 6> pinned_{};           // a GPU call's storages whose device copy it pinned
  std::array<double, 8> f_{};
  std::array<int32_t, 8> i_{};
  std::array<Slot, 16> slots_{};
  std::array<void*, 16> args_{};
  void* context_ = nullptr;
  int nb_ = 0, nf_ = 0, ni_ = 0, na_ = 1;  // slot 0: the context
};

// Runs one kernel of the group: the scheduler chooses the device and the variant, and the call runs
// on the caller's thread or on the chosen device's queue, after the calls it depends on.
void launch(const KernelGroup& g, const CallExtents& extents, KernelArgs&& args);

// Merges adjacent dims of same-shaped views where every view allows it (strides nest), and drops
// size-1 dims, then pads to exactly kMaxDims dims. Returns false if more than kMaxDims remain.
bool collapse(const Shape& shape, const std::vector<const Shape*>& strides,
              std::vector<View>& views);

// Output shape of NumPy broadcasting; the error names the op and the shapes.
Shape broadcast_shapes(const char* op, const std::vector<Tensor>& inputs);
Shape broadcast_shapes(const char* op, const std::vector<Shape>& shapes);

CallExtents extents_of(const View& v);

// Runs a one-input 6-D strided kernel (copy, cast) from src to dst, same shape, any strides. With
// more independent strides than one kernel takes, it makes one call per slice of the outer dim.
void run_strided(const KernelGroup& g, const Tensor& src, const Tensor& dst);
CallExtents extents(std::initializer_list<int64_t> e);

int wrap_axis(const char* op, int axis, int rank);

// A result made without a kernel (empty, or a constant) goes where a kernel's would have: to the
// GPU device an input lives on, if any.
Tensor place_like(const Tensor& out, const std::vector<Tensor>& inputs);

}  // namespace opforge::detail
