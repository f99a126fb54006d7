// The OpenCL device kind: every device the ICD loader (libOpenCL.so.1, opened with dlopen, so
// building and running need none) lists, each with its own context and in-order command queue.
// Halide's OpenCL runtime asks for its context through halide_acquire_cl_context, whose weak
// default serves one device per process; the definition here replaces it and takes the device
// from the call's user context (UserContext::opencl), so that opencl:0, opencl:1, ... all run
// kernels and hold tensors. (It lives in this file, with the backend, because the linker must load
// it: nothing would pull a file holding only it from the archive.)
#include <HalideRuntimeOpenCL.h>
#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "devices/cpu/load_meter.hpp"
#include "devices/gpu_memory.hpp"
#include "devices/halide_gpu.hpp"
#include "opforge/error.hpp"

namespace opforge::detail {
namespace {

// ---- the ICD loader ----
struct OpenCL {
  int (*platforms)(unsigned, void**, unsigned*) = nullptr;
  int (*device_ids)(void*, uint64_t, unsigned, void**, unsigned*) = nullptr;
  int (*device_info)(void*, unsigned, size_t, void*, size_t*) = nullptr;
  std::vector<void*> ids;
  void* lib = nullptr;
  OpenCL() {
    lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    platforms = reinterpret_cast<decltype(platforms)>(dlsym(lib, "clGetPlatformIDs"));
    device_ids = reinterpret_cast<decltype(device_ids)>(dlsym(lib, "clGetDeviceIDs"));
    device_info = reinterpret_cast<decltype(device_info)>(dlsym(lib, "clGetDeviceInfo"));
    if (!platforms || !device_ids || !device_info) return;
    unsigned np = 0;
    if (platforms(0, nullptr, &np) != 0 || np == 0) return;
    std::vector<void*> ps(np);
    platforms(np, ps.data(), nullptr);
    constexpr uint64_t kAllTypes = 0xFFFFFFFF;
    for (void* p : ps) {
      unsigned nd = 0;
      if (device_ids(p, kAllTypes, 0, nullptr, &nd) != 0 || nd == 0) continue;
      std::vector<void*> ds(nd);
      device_ids(p, kAllTypes, nd, ds.data(), nullptr);
      ids.insert(ids.end(), ds.begin(), ds.end());
    }
  }
  void* function(const char* name) const { return lib ? dlsym(lib, name) : nullptr; }
};
const OpenCL& opencl() {
  static auto* o = new OpenCL;  // never destroyed: Halide releases OpenCL buffers at exit
  return *o;
}

// CL_DEVICE_MEM_BASE_ADDR_ALIGN of device `index`, in bytes.
size_t offset_align(size_t index) {
  const OpenCL& cl = opencl();
  constexpr unsigned kBaseAddrAlign = 0x1019;  // in bits
  unsigned bits = 0;
  if (cl.device_info(cl.ids[index], kBaseAddrAlign, sizeof(bits), &bits, nullptr) != 0 || bits < 8)
    return 4096;  // unknown: a page is a multiple of every alignment drivers report
  return bits / 8;
}

class OpenClBackend final : public HalideGpuBackend {
 public:
  OpenClBackend(DeviceInfo info, size_t align)
      : HalideGpuBackend(std::move(info), halide_opencl_device_interface()), align_(align) {
    context_.opencl = device().index;
    // point() builds Halide's OpenCL handle itself: make sure the layout is the one it expects.
    DeviceHandle h{24, 0x1230};
    halide_buffer_t probe{};
    probe.device = reinterpret_cast<uint64_t>(&h);
    probe.device_interface = iface_;
    OPFORGE_CHECK(halide_opencl_get_crop_offset(nullptr, &probe) == 24 &&
                  halide_opencl_get_cl_mem(nullptr, &probe) == 0x1230)
        << "internal: Halide's OpenCL device handle is not laid out as {offset, cl_mem}";
  }
  // An OpenCL device on the host's cores (PoCL) feels the host's load.
  std::unique_ptr<LoadMeter> load_meter(int) const override {
    return info().shares_cpu_cores ? std::make_unique<LoadMeter>(all_cpu_cores(), nullptr)
                                   : nullptr;
  }
  // OpenCL has no query for a device's memory in use: what this process holds there is the best
  // answer, for both questions. Its utilisation is the share of time its queue ran calls.
  uint64_t used_memory(bool) override { return memory_->reserved(); }

 protected:
  uint64_t native(const halide_buffer_t& b) const override {
    return halide_opencl_get_cl_mem(nullptr, const_cast<halide_buffer_t*>(&b));
  }
  bool point(halide_buffer_t& buf, uint64_t raw, size_t offset, DeviceHandle& h,
             bool kernel) const override {
    // A kernel argument at an offset becomes a sub-buffer, which must start at a multiple of the
    // device's base address alignment; copies take any offset.
    if (kernel && offset % align_) return false;
    h = {offset, raw};
    buf.device = reinterpret_cast<uint64_t>(&h);
    return true;
  }

 private:
  size_t align_;
};

// ---- one context and in-order queue per device, for Halide ----
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
    for (size_t i = 0; i < opencl().ids.size(); i++) v->push_back(std::make_unique<ClDevice>());
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
  const OpenCL& cl = opencl();
  auto create_context = reinterpret_cast<CreateContext>(cl.function("clCreateContext"));
  auto create_queue = reinterpret_cast<CreateQueue>(cl.function("clCreateCommandQueue"));
  auto release_context = reinterpret_cast<Release>(cl.function("clReleaseContext"));
  if (!create_context || !create_queue || !release_context || index >= cl.ids.size())
    return kClDeviceNotFound;
  void* id = cl.ids[index];
  int err = 0;
  void* context = create_context(nullptr, 1, &id, nullptr, nullptr, &err);
  if (err != 0) return err;
  void* queue = create_queue(context, id, 0, &err);  // in order: 0 properties
  if (err != 0) {
    release_context(context);
    return err;
  }
  d.context = context;
  d.queue = queue;
  return 0;
}

}  // namespace

std::vector<std::unique_ptr<Backend>> discover_opencl() {
  std::vector<std::unique_ptr<Backend>> out;
  const OpenCL& cl = opencl();
  for (size_t i = 0; i < cl.ids.size(); i++) {
    constexpr unsigned kName = 0x102B, kGlobalMem = 0x101F, kType = 0x1000;
    constexpr uint64_t kTypeCpu = 2;
    char name[256] = {};
    uint64_t mem = 0, type = 0;
    cl.device_info(cl.ids[i], kName, sizeof(name) - 1, name, nullptr);
    cl.device_info(cl.ids[i], kGlobalMem, sizeof(mem), &mem, nullptr);
    cl.device_info(cl.ids[i], kType, sizeof(type), &type, nullptr);
    DeviceInfo info{{DeviceKind::opencl, int(i)}, name, mem};
    info.shares_cpu_cores = (type & kTypeCpu) != 0;
    out.push_back(std::make_unique<OpenClBackend>(info, offset_align(i)));
  }
  return out;
}

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
