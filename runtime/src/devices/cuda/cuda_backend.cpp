// The CUDA device kind. cuda:N is the driver's device N (libcuda.so.1, opened with dlopen, so
// CUDA_VISIBLE_DEVICES applies as in every CUDA program); usage figures come from NVML, matched to
// it by PCI bus id. In a build with CUDA kernels each GPU runs them in its primary context (the one
// the CUDA runtime and cuBLAS use too) on one stream of its own; without them the GPUs are listed
// and queried but run nothing.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "devices/backend.hpp"
#include "opforge/error.hpp"

#ifdef OPFORGE_HAVE_CUDA_KERNELS
#include <HalideRuntimeCuda.h>

#include "devices/gpu_memory.hpp"
#include "devices/halide_gpu.hpp"
#endif

namespace opforge::detail {
namespace {

// ---- NVML, loaded on first use ----
struct Nvml {
  using Handle = void*;
  int (*init)() = nullptr;
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*memory)(Handle, Memory*) = nullptr;
  struct Utilization {
    unsigned gpu, memory;
  };
  int (*utilization)(Handle, Utilization*) = nullptr;
  struct ProcessInfo {
    unsigned pid;
    unsigned long long used;
    unsigned gpu_instance, compute_instance;
  };
  int (*processes)(Handle, unsigned*, ProcessInfo*) = nullptr;
  int (*by_bus_id)(const char*, Handle*) = nullptr;
  bool ok = false;

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto sym = [&](auto& fn, const char* s) {
      fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, s));
    };
    sym(init, "nvmlInit_v2");
    sym(memory, "nvmlDeviceGetMemoryInfo");
    sym(utilization, "nvmlDeviceGetUtilizationRates");
    sym(processes, "nvmlDeviceGetComputeRunningProcesses_v3");
    sym(by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    ok = init && memory && utilization && by_bus_id && init() == 0;
  }
};
const Nvml& nvml() {
  static Nvml n;
  return n;
}

// ---- the driver, loaded on first use ----
struct CudaGpu {
  std::string name;
  uint64_t memory = 0;
  Nvml::Handle nvml = nullptr;  // null where NVML is missing or does not know the GPU
};
struct CudaDriver {
  void* lib = nullptr;
  std::vector<CudaGpu> gpus;
  CudaDriver() {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
    auto count = reinterpret_cast<int (*)(int*)>(dlsym(lib, "cuDeviceGetCount"));
    auto get = reinterpret_cast<int (*)(int*, int)>(dlsym(lib, "cuDeviceGet"));
    auto name = reinterpret_cast<int (*)(char*, int, int)>(dlsym(lib, "cuDeviceGetName"));
    auto total = reinterpret_cast<int (*)(size_t*, int)>(dlsym(lib, "cuDeviceTotalMem_v2"));
    auto bus_id = reinterpret_cast<int (*)(char*, int, int)>(dlsym(lib, "cuDeviceGetPCIBusId"));
    int n = 0;
    // No driver, no GPU, or a driver that fails to start: no cuda:N, and no error.
    if (!init || !count || !get || !name || !total || !bus_id || init(0) != 0 || count(&n) != 0)
      return;
    for (int i = 0; i < n; i++) {
      int dev = 0;
      char gpu_name[128] = {}, bus[32] = {};
      size_t bytes = 0;
      if (get(&dev, i) != 0 || name(gpu_name, sizeof(gpu_name) - 1, dev) != 0 ||
          total(&bytes, dev) != 0)
        break;  // ordinals must stay dense: cuda:N is the driver's device N
      CudaGpu g{gpu_name, bytes, nullptr};
      const Nvml& nv = nvml();
      if (nv.ok && bus_id(bus, sizeof(bus) - 1, dev) == 0 && nv.by_bus_id(bus, &g.nvml) != 0)
        g.nvml = nullptr;
      gpus.push_back(std::move(g));
    }
  }
  void* function(const char* name) const { return lib ? dlsym(lib, name) : nullptr; }
};
const CudaDriver& driver() {
  static auto* d = new CudaDriver;  // never destroyed: kernels may still run at exit
  return *d;
}

Nvml::Handle nvml_handle(const Device& d) {
  const auto& gpus = driver().gpus;
  Nvml::Handle h = size_t(d.index) < gpus.size() ? gpus[size_t(d.index)].nvml : nullptr;
  OPFORGE_CHECK(h) << d.str()
                   << ": NVML (libnvidia-ml.so.1) is not available or does not know this GPU, so "
                      "there are no usage figures for it";
  return h;
}

// What NVML says the process holds on the GPU (whole: what everyone holds); `reserved`: what our
// allocator holds there, a lower bound.
uint64_t nvml_used_memory(const Device& d, bool process_only, uint64_t reserved) {
  const Nvml& n = nvml();
  Nvml::Handle h = nvml_handle(d);
  if (!process_only) {
    Nvml::Memory m{};
    OPFORGE_CHECK(n.memory(h, &m) == 0) << d.str() << ": NVML memory query failed";
    return m.used;
  }
  OPFORGE_CHECK(n.processes) << d.str() << ": this NVML has no per-process memory query";
  std::vector<Nvml::ProcessInfo> procs(64);
  unsigned count = unsigned(procs.size());
  int rc;
  constexpr int kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE: count says how many
  while ((rc = n.processes(h, &count, procs.data())) == kInsufficientSize) {
    procs.resize(count + 16);
    count = unsigned(procs.size());
  }
  OPFORGE_CHECK(rc == 0) << d.str() << ": NVML process query failed";
  uint64_t mine = 0;
  for (unsigned i = 0; i < count; i++)
    if (procs[i].pid == unsigned(getpid())) mine += procs[i].used;
  // In a container NVML reports the host's process ids, so this process may not be found: it
  // holds at least what its allocator reserved.
  return std::max<uint64_t>(mine, reserved);
}

double nvml_utilization(const Device& d) {
  Nvml::Utilization u{};
  OPFORGE_CHECK(nvml().utilization(nvml_handle(d), &u) == 0)
      << d.str() << ": NVML utilization query failed";
  return u.gpu;
}

#ifdef OPFORGE_HAVE_CUDA_KERNELS
// Halide's CUDA runtime creates one context, on one GPU, per process. Its context handler is
// replaced by one that returns the primary context of the GPU the call's user context names
// (UserContext::cuda); Halide makes it current around each of its calls, so nothing here needs a
// lock beyond creating the contexts and streams.
struct CudaContexts {
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_retain)(void**, int) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  std::mutex mu;
  std::vector<void*> contexts, streams;
  CudaContexts() {
    const CudaDriver& d = driver();
    init = reinterpret_cast<decltype(init)>(d.function("cuInit"));
    device_get = reinterpret_cast<decltype(device_get)>(d.function("cuDeviceGet"));
    primary_retain =
        reinterpret_cast<decltype(primary_retain)>(d.function("cuDevicePrimaryCtxRetain"));
    stream_create = reinterpret_cast<decltype(stream_create)>(d.function("cuStreamCreate"));
  }
};

CudaContexts& contexts() {
  static auto* d = new CudaContexts;  // never destroyed: Halide may ask for a context at exit
  return *d;
}

constexpr int kNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED

size_t gpu_of(void* user_context) {
  auto* u = static_cast<UserContext*>(user_context);
  return u && u->cuda > 0 ? size_t(u->cuda) : 0;
}

int acquire_context(void* user_context, void** ctx, bool create) {
  size_t index = gpu_of(user_context);
  CudaContexts& drv = contexts();
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

int release_context(void*) { return 0; }

// Halide's kernels and copies run on the stream this returns (by default the legacy default stream
// of the context). Each GPU gets one stream of its own, created in its primary context (current
// while Halide calls this). It is a blocking stream (flags 0), so work that Halide or a library
// issues on the legacy default stream stays ordered with it.
int get_stream(void* user_context, void*, void** stream) {
  size_t index = gpu_of(user_context);
  CudaContexts& drv = contexts();
  std::lock_guard<std::mutex> lock(drv.mu);
  if (drv.streams.size() <= index) drv.streams.resize(index + 1);
  if (!drv.streams[index]) {
    if (!drv.stream_create) return kNotInitialized;
    if (int rc = drv.stream_create(&drv.streams[index], 0); rc != 0) return rc;
  }
  *stream = drv.streams[index];
  return 0;
}

class CudaBackend final : public HalideGpuBackend {
 public:
  explicit CudaBackend(DeviceInfo info)
      : HalideGpuBackend(std::move(info), halide_cuda_device_interface()) {
    static const bool hooked = [] {
      halide_set_cuda_acquire_context(acquire_context);
      halide_set_cuda_release_context(release_context);
      halide_set_cuda_get_stream(get_stream);
      return true;
    }();
    (void)hooked;
    context_.cuda = device().index;
  }
  uint64_t used_memory(bool process_only) override {
    return nvml_used_memory(device(), process_only, memory_->reserved());
  }
  double utilization() override { return nvml_utilization(device()); }

 protected:
  uint64_t native(const halide_buffer_t& b) const override { return b.device; }
  bool point(halide_buffer_t& buf, uint64_t raw, size_t offset, DeviceHandle&,
             bool) const override {
    buf.device = raw + offset;  // a device pointer addresses any byte
    return true;
  }
};
#endif

// A GPU this build has no kernels for: listed and queried, runs nothing.
class CudaListedBackend final : public Backend {
 public:
  using Backend::Backend;
  bool runs_kernels() const override { return false; }
  uint64_t used_memory(bool process_only) override {
    return nvml_used_memory(device(), process_only, 0);
  }
  double utilization() override { return nvml_utilization(device()); }
};

}  // namespace

std::vector<std::unique_ptr<Backend>> discover_cuda() {
  std::vector<std::unique_ptr<Backend>> out;
  const auto& gpus = driver().gpus;
  for (size_t i = 0; i < gpus.size(); i++) {
    DeviceInfo info{{DeviceKind::cuda, int(i)}, gpus[i].name, gpus[i].memory};
#ifdef OPFORGE_HAVE_CUDA_KERNELS
    out.push_back(std::make_unique<CudaBackend>(info));
#else
    out.push_back(std::make_unique<CudaListedBackend>(info));
#endif
  }
  return out;
}

}  // namespace opforge::detail
