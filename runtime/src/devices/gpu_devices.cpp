// GPU devices: the per-device caching allocator and the copies, through Halide's device interface
// (the same code serves OpenCL and CUDA, and the kernels Halide generated take the blocks as they
// are), and one OpenCL context and command queue per OpenCL device. Halide's OpenCL runtime asks
// for its context through halide_acquire_cl_context, whose weak default serves one device per
// process; the definition here replaces it and takes the device from the call's user context
// (UserContext::opencl), so that opencl:0, opencl:1, ... all run kernels and hold tensors. (It
// lives in this file because the linker must load it: nothing else would pull it from the archive.)
#include "devices/gpu_devices.hpp"

#include <HalideRuntimeOpenCL.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernel_call.hpp"
#include "opforge/error.hpp"
#include "core/storage.hpp"

#ifdef OPFORGE_HAVE_CUDA_KERNELS
#include <HalideRuntimeCuda.h>
#endif

namespace opforge::detail {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    u++;
  }
  char s[48];
  std::snprintf(s, sizeof s, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return s;
}

void byte_buffer(halide_buffer_t& b, halide_dimension_t& dim, size_t bytes) {
  OPFORGE_CHECK(bytes <= size_t(INT32_MAX))
      << "a tensor on a GPU device holds at most 2 GiB (the 32-bit extents of generated kernels); "
      << "this one needs " << bytes << " bytes";
  dim = {0, int32_t(bytes), 1, 0};
  b.type = {halide_type_uint, 8, 1};
  b.dimensions = 1;
  b.dim = &dim;
}

}  // namespace

DeviceMemory::DeviceMemory(const Device& d, const halide_device_interface_t* iface, uint64_t total,
                           size_t offset_align)
    : device_(d), iface_(iface), total_(total), align_(offset_align), limit_(total) {
  if (d.kind == DeviceKind::cuda) context_.cuda = d.index;
  if (d.kind != DeviceKind::opencl) return;
  context_.opencl = d.index;
  // bind() builds Halide's OpenCL handle itself: make sure the layout is the one it expects.
  DeviceHandle h{24, 0x1230};
  halide_buffer_t probe{};
  probe.device = reinterpret_cast<uint64_t>(&h);
  probe.device_interface = iface;
  OPFORGE_CHECK(halide_opencl_get_crop_offset(nullptr, &probe) == 24 &&
                halide_opencl_get_cl_mem(nullptr, &probe) == 0x1230)
      << "internal: Halide's OpenCL device handle is not laid out as {offset, cl_mem}";
}

DeviceBlock* DeviceMemory::allocate(size_t bytes, const Storage* for_storage) {
  size_t cap = size_class(std::max<size_t>(bytes, 1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cap);
    if (it != free_.end() && !it->second.empty()) {
      DeviceBlock* b = it->second.back();
      it->second.pop_back();
      cached_ -= cap;
      allocated_ += cap;
      return b;
    }
  }
  auto b = std::make_unique<DeviceBlock>();
  byte_buffer(b->buf, b->dim, cap);
  b->capacity = cap;
  auto try_malloc = [&] {
    if (allocated_ + cap > limit_) return false;
    take_halide_error();
    return halide_device_malloc(&context_, &b->buf, iface_) == 0;
  };
  if (!try_malloc()) {
    empty_cache();
    // Then the copies that host tensors keep here as a cache, and stale copies.
    if (!try_malloc() && !evict_until(for_storage, cap, [&] {
          empty_cache();
          return try_malloc();
        })) {
      std::string why = allocated_ + cap > limit_ ? "" : " (" + take_halide_error() + ")";
      throw OutOfMemoryError(
          device_.str() + ": out of memory allocating " + human_bytes(double(bytes)) + " (" +
          std::to_string(bytes) + " bytes)" + why + "; " + human_bytes(double(allocated_)) +
          " held by tensors, cache emptied; this process may use " + human_bytes(double(limit_)) +
          " of " + human_bytes(double(total_)) + " (set_memory_fraction)");
    }
  }
  b->raw = device_.kind == DeviceKind::opencl ? halide_opencl_get_cl_mem(nullptr, &b->buf)
                                              : b->buf.device;
  allocated_ += cap;
  return b.release();
}

void DeviceMemory::remember(Storage* s) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  holders_[s] = ++use_clock_;
}

void DeviceMemory::forget(Storage* s) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  holders_.erase(s);
}

bool DeviceMemory::evict_until(const Storage* skip, size_t bytes,
                               const std::function<bool()>& fits) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  std::vector<std::pair<uint64_t, Storage*>> by_age;
  for (auto [s, used] : holders_)
    if (s != skip) by_age.emplace_back(used, s);
  std::sort(by_age.begin(), by_age.end());
  size_t freed = 0;
  for (auto [used, s] : by_age) {
    size_t n = s->evict(*this);
    if (n == 0) continue;
    holders_.erase(s);
    freed += n;
    // Blocks come in size classes: retry once what went back could hold the request.
    if (freed >= bytes) {
      if (fits()) return true;
      freed = 0;
    }
  }
  return freed > 0 && fits();
}

void DeviceMemory::release(DeviceBlock* b) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[b->capacity].push_back(b);
  cached_ += b->capacity;
  allocated_ -= b->capacity;
}

void DeviceMemory::empty_cache() {
  std::unordered_map<size_t, std::vector<DeviceBlock*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    cached_ = 0;
  }
  for (auto& [cap, list] : blocks)
    for (DeviceBlock* b : list) {
      halide_device_free(&context_, &b->buf);
      delete b;
    }
}

size_t DeviceMemory::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_ + cached_;
}

void DeviceMemory::set_fraction(double fraction) {
  OPFORGE_CHECK(fraction > 0 && fraction <= 1)
      << "set_memory_fraction: " << fraction << " is not in (0, 1]";
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = size_t(fraction * double(total_));
}

bool DeviceMemory::bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset,
                        DeviceHandle& h) const {
  if (device_.kind == DeviceKind::opencl) {
    if (offset % align_) return false;
    h = {offset, b.raw};
    buf.device = reinterpret_cast<uint64_t>(&h);
  } else {
    buf.device = b.raw + offset;
  }
  buf.device_interface = iface_;
  return true;
}

void DeviceMemory::transfer(halide_buffer_t& hb, const DeviceBlock& b, bool to_device,
                            size_t bytes) {
  DeviceHandle h;
  bind(hb, b, 0, h);
  take_halide_error();
  auto t0 = std::chrono::steady_clock::now();
  int rc;
  if (to_device) {
    hb.set_host_dirty(true);
    rc = halide_copy_to_device(&context_, &hb, iface_);
  } else {
    hb.set_device_dirty(true);
    rc = halide_copy_to_host(&context_, &hb);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  OPFORGE_CHECK(rc == 0) << device_.str() << ": copying " << bytes << " bytes "
                         << (to_device ? "to" : "from")
                         << " the device failed: " << take_halide_error();
  copied_[to_device] += bytes;
  // Small copies measure latency, not bandwidth.
  if (bytes >= (size_t(1) << 16) && s > 0) {
    double bw = bandwidth_.load(std::memory_order_relaxed);
    bandwidth_.store(0.8 * bw + 0.2 * double(bytes) / s, std::memory_order_relaxed);
  }
}

void DeviceMemory::upload(DeviceBlock& b, const void* src, size_t bytes) {
  if (!bytes) return;
  halide_buffer_t hb{};
  halide_dimension_t dim{};
  byte_buffer(hb, dim, bytes);
  hb.host = static_cast<uint8_t*>(const_cast<void*>(src));
  transfer(hb, b, true, bytes);
}

void DeviceMemory::download(const DeviceBlock& b, void* dst, size_t bytes) {
  if (!bytes) return;
  halide_buffer_t hb{};
  halide_dimension_t dim{};
  byte_buffer(hb, dim, bytes);
  hb.host = static_cast<uint8_t*>(dst);
  transfer(hb, b, false, bytes);
}

void DeviceMemory::copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst,
                        size_t dst_offset, size_t n) {
  if (!n) return;
  halide_buffer_t s{}, d{};
  halide_dimension_t sd{}, dd{};
  byte_buffer(s, sd, n);
  byte_buffer(d, dd, n);
  // Copies take any offset, also on OpenCL: point the handles without bind()'s alignment rule.
  DeviceHandle sh{src_offset, src.raw}, dh{dst_offset, dst.raw};
  bool cl = device_.kind == DeviceKind::opencl;
  s.device = cl ? reinterpret_cast<uint64_t>(&sh) : src.raw + src_offset;
  d.device = cl ? reinterpret_cast<uint64_t>(&dh) : dst.raw + dst_offset;
  s.device_interface = d.device_interface = iface_;
  take_halide_error();
  OPFORGE_CHECK(halide_buffer_copy(&context_, &s, iface_, &d) == 0)
      << device_.str() << ": copying " << n
      << " bytes on the device failed: " << take_halide_error();
}

void DeviceMemory::sync(halide_buffer_t& on_device) {
  take_halide_error();
  OPFORGE_CHECK(halide_device_sync(&context_, &on_device) == 0)
      << device_.str() << ": waiting for the device failed: " << take_halide_error();
}

void DeviceMemory::sync_all() {
  // Halide 14's OpenCL and CUDA syncs finish the device's whole queue or stream, but want a buffer
  // that lives there: a one-byte one of its own, outside the allocator's figures.
  std::call_once(fence_once_, [&] {
    byte_buffer(fence_.buf, fence_.dim, 1);
    take_halide_error();
    fence_ok_ = halide_device_malloc(&context_, &fence_.buf, iface_) == 0;
  });
  OPFORGE_CHECK(fence_ok_) << device_.str()
                           << ": cannot allocate the byte that waiting for the device needs: "
                           << take_halide_error();
  sync(fence_.buf);
}

#ifdef OPFORGE_HAVE_CUDA_KERNELS
namespace {

// Halide's CUDA runtime creates one context, on one GPU, per process. Its context handler is
// replaced by one that returns the primary context of the GPU the call's user context names
// (UserContext::cuda), the context the CUDA runtime and cuBLAS use too; Halide makes it current
// around each of its calls, so nothing here needs a lock beyond creating the contexts.
struct CudaContexts {
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_retain)(void**, int) = nullptr;
  std::mutex mu;
  std::vector<void*> contexts;
  CudaContexts() {
    init = reinterpret_cast<decltype(init)>(cuda_function("cuInit"));
    device_get = reinterpret_cast<decltype(device_get)>(cuda_function("cuDeviceGet"));
    primary_retain =
        reinterpret_cast<decltype(primary_retain)>(cuda_function("cuDevicePrimaryCtxRetain"));
  }
};

CudaContexts& cuda_contexts() {
  static auto* d = new CudaContexts;  // never destroyed: Halide may ask for a context at exit
  return *d;
}

int acquire_cuda_context(void* user_context, void** ctx, bool create) {
  constexpr int kNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED
  auto* u = static_cast<UserContext*>(user_context);
  size_t index = u && u->cuda > 0 ? size_t(u->cuda) : 0;
  CudaContexts& drv = cuda_contexts();
  std::lock_guard<std::mutex> lock(drv.mu);
  if (drv.contexts.size() <= index) drv.contexts.resize(index + 1);
  if (!drv.contexts[index] && create) {
    if (!drv.init || !drv.device_get || !drv.primary_retain) return kNotInitialized;
    int device = 0;
    void* context = nullptr;
    if (int rc = drv.init(0); rc != 0) return rc;
    if (int rc = drv.device_get(&device, int(index)); rc != 0) return rc;
    if (int rc = drv.primary_retain(&context, device); rc != 0) return rc;
    drv.contexts[index] = context;
  }
  *ctx = drv.contexts[index];
  return 0;
}

int release_cuda_context(void*) { return 0; }

void use_cuda_primary_contexts() {
  static const bool done = [] {
    halide_set_cuda_acquire_context(acquire_cuda_context);
    halide_set_cuda_release_context(release_cuda_context);
    return true;
  }();
  (void)done;
}

}  // namespace
#endif

DeviceMemory* device_memory(const Device& d) {
  // Never destroyed: tensors in static storage may release blocks late.
  static auto* table = [] {
    auto* t = new std::vector<std::unique_ptr<DeviceMemory>>;
    for (const DeviceInfo& info : devices()) {
      // Every device has its own context: OpenCL's below, CUDA's primary contexts.
      if (info.device.kind == DeviceKind::opencl)
        t->push_back(std::make_unique<DeviceMemory>(info.device, halide_opencl_device_interface(),
                                                    info.total_memory,
                                                    opencl_offset_align(info.device.index)));
#ifdef OPFORGE_HAVE_CUDA_KERNELS
      if (info.device.kind == DeviceKind::cuda) {
        use_cuda_primary_contexts();
        t->push_back(std::make_unique<DeviceMemory>(info.device, halide_cuda_device_interface(),
                                                    info.total_memory, 1));
      }
#endif
    }
    return t;
  }();
  if (d.kind == DeviceKind::cpu) return nullptr;
  for (const auto& m : *table)
    if (m->device() == d) return m.get();
  return nullptr;
}

}  // namespace opforge::detail

namespace opforge::detail {
namespace {

struct ClDevice {
  std::mutex mu;  // held from acquire to release, as Halide expects
  // Who holds `mu`: Halide calls release after a failed acquire on some paths and not on others.
  std::atomic<std::thread::id> owner{};
  void* context = nullptr;
  void* queue = nullptr;
};

// Never destroyed: Halide's own clean-up acquires the context at exit.
std::vector<std::unique_ptr<ClDevice>>& cl_devices() {
  static auto* devs = [] {
    auto* v = new std::vector<std::unique_ptr<ClDevice>>;
    for (int i = 0; opencl_device_id(i); i++) v->push_back(std::make_unique<ClDevice>());
    return v;
  }();
  return *devs;
}

size_t index_of(void* user_context) {
  auto* u = static_cast<UserContext*>(user_context);
  return u && u->opencl > 0 ? size_t(u->opencl) : 0;
}

constexpr int kClDeviceNotFound = -1;

// Halide 14 spells every OpenCL compare-and-swap atomic_cmpxchg, which OpenCL C defines for 32-bit
// integers only: 64-bit ones (float64 and int64 reductions that Li2018 schedules with atomics) fail
// to build. atom_cmpxchg is the same operation for both widths (cl_khr_*_base_atomics, which the
// kernels enable). PoCL renames the builtins in a header of its own (atomic_cmpxchg to
// _cl_atomic_cmpxchg), hence the second definition, and warns that it redefines the first: -w, as
// warnings about generated code are nothing a user can act on.
constexpr const char* kClBuildOptions =
    "-w -Datomic_cmpxchg=atom_cmpxchg -D_cl_atomic_cmpxchg=_cl_atom_cmpxchg";

int create(ClDevice& d, size_t index) {
  static const bool options_set = (halide_opencl_set_build_options(kClBuildOptions), true);
  (void)options_set;
  using CreateContext = void* (*)(const intptr_t*, unsigned, void* const*, void*, void*, int*);
  using CreateQueue = void* (*)(void*, void*, uint64_t, int*);
  using Release = int (*)(void*);
  auto create_context = reinterpret_cast<CreateContext>(opencl_function("clCreateContext"));
  auto create_queue = reinterpret_cast<CreateQueue>(opencl_function("clCreateCommandQueue"));
  auto release_context = reinterpret_cast<Release>(opencl_function("clReleaseContext"));
  void* id = opencl_device_id(int(index));
  if (!create_context || !create_queue || !release_context || !id) return kClDeviceNotFound;
  int err = 0;
  void* context = create_context(nullptr, 1, &id, nullptr, nullptr, &err);
  if (err != 0) return err;
  void* queue = create_queue(context, id, 0, &err);
  if (err != 0) {
    release_context(context);
    return err;
  }
  d.context = context;
  d.queue = queue;
  return 0;
}

}  // namespace
}  // namespace opforge::detail

extern "C" int halide_acquire_cl_context(void* user_context, void** ctx, void** q, bool create) {
  using namespace opforge::detail;
  size_t i = index_of(user_context);
  auto& devs = cl_devices();
  if (i >= devs.size()) return kClDeviceNotFound;
  ClDevice& d = *devs[i];
  d.mu.lock();
  if (!d.context && create)
    if (int err = opforge::detail::create(d, i); err != 0) {
      d.mu.unlock();
      return err;
    }
  d.owner = std::this_thread::get_id();
  *ctx = d.context;
  *q = d.queue;
  return 0;
}

extern "C" int halide_release_cl_context(void* user_context) {
  using namespace opforge::detail;
  size_t i = index_of(user_context);
  auto& devs = cl_devices();
  if (i >= devs.size() || devs[i]->owner != std::this_thread::get_id()) return 0;
  devs[i]->owner = std::thread::id{};
  devs[i]->mu.unlock();
  return 0;
}
