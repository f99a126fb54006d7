// Device discovery and queries. CPU figures come from /proc; CUDA GPUs from the driver and their
// usage from NVML, OpenCL from the ICD loader, all opened with dlopen so that building and running
// need none of them.
#include "opforge/device.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "devices/cpu_devices.hpp"
#include "devices/gpu_devices.hpp"
#include "opforge/error.hpp"
#include "opforge/registry.hpp"

namespace opforge {
namespace {

const char* kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::opencl:
      return "opencl";
    case DeviceKind::cuda:
      return "cuda";
  }
  return "?";
}

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

// ---- The CUDA driver, loaded on first use. cuda:N is the driver's device N, so
// CUDA_VISIBLE_DEVICES applies as in every CUDA program; NVML (which numbers all GPUs its own way)
// is matched to it by PCI bus id. ----
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
};
const CudaDriver& cuda_driver() {
  static auto* d = new CudaDriver;  // never destroyed: kernels may still run at exit
  return *d;
}

Nvml::Handle nvml_handle(const Device& d) {
  const auto& gpus = cuda_driver().gpus;
  Nvml::Handle h = size_t(d.index) < gpus.size() ? gpus[size_t(d.index)].nvml : nullptr;
  OPFORGE_CHECK(h) << d.str()
                   << ": NVML (libnvidia-ml.so.1) is not available or does not know this GPU, so "
                      "there are no usage figures for it";
  return h;
}

// ---- OpenCL ICD loader ----
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
};
const OpenCL& opencl() {
  static auto* o = new OpenCL;  // never destroyed: Halide releases OpenCL buffers at exit
  return *o;
}
}  // namespace

void* detail::opencl_device_id(int index) {
  const OpenCL& cl = opencl();
  return index >= 0 && size_t(index) < cl.ids.size() ? cl.ids[size_t(index)] : nullptr;
}

void* detail::opencl_function(const char* name) {
  return opencl().lib ? dlsym(opencl().lib, name) : nullptr;
}

void* detail::cuda_function(const char* name) {
  return cuda_driver().lib ? dlsym(cuda_driver().lib, name) : nullptr;
}

size_t detail::opencl_offset_align(int index) {
  const OpenCL& cl = opencl();
  constexpr unsigned kBaseAddrAlign = 0x1019;  // in bits
  unsigned bits = 0;
  if (index < 0 || size_t(index) >= cl.ids.size() ||
      cl.device_info(cl.ids[size_t(index)], kBaseAddrAlign, sizeof(bits), &bits, nullptr) != 0 ||
      bits < 8)
    return 4096;  // unknown: a page is a multiple of every alignment drivers report
  return bits / 8;
}

namespace {

std::string read_file(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint64_t meminfo_kib(const std::string& key) {
  std::istringstream in(read_file("/proc/meminfo"));
  std::string k;
  uint64_t v;
  std::string unit;
  while (in >> k >> v >> unit)
    if (k == key + ":") return v;
  throw Error("cpu: /proc/meminfo has no " + key);
}

std::vector<DeviceInfo> discover() {
  std::vector<DeviceInfo> out;
  std::string cpu_name = "cpu";
  std::istringstream cpuinfo(read_file("/proc/cpuinfo"));
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu_name = line.substr(line.find(':') + 2);
      break;
    }
  uint64_t ram = meminfo_kib("MemTotal") * 1024;
  const auto& pools = detail::cpu_pools();
  if (pools.empty()) out.push_back({{DeviceKind::cpu, 0}, cpu_name, ram, num_cpu_cores(true)});
  for (size_t i = 0; i < pools.size(); i++) {
    std::string cores;
    for (int c : pools[i]->cores()) {
      if (!cores.empty()) cores += ",";
      cores += std::to_string(c);
    }
    out.push_back({{DeviceKind::cpu, int(i)},
                   cpu_name + " (cores " + cores + ")",
                   ram,
                   int(pools[i]->cores().size())});
  }
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
    out.push_back(info);
  }
  const auto& gpus = cuda_driver().gpus;
  for (size_t i = 0; i < gpus.size(); i++)
    out.push_back({{DeviceKind::cuda, int(i)}, gpus[i].name, gpus[i].memory});
  return out;
}

std::string known_devices() {
  std::string s;
  for (const auto& d : devices()) {
    if (!s.empty()) s += ", ";
    s += d.device.str();
  }
  return s;
}

void check_exists(const Device& d, const char* what) {
  OPFORGE_CHECK(device_exists(d)) << what << ": no device " << d.str()
                                  << " on this machine; devices: " << known_devices();
}

struct CpuTimes {
  uint64_t busy = 0, total = 0;
};
CpuTimes cpu_times() {
  std::istringstream in(read_file("/proc/stat"));
  std::string cpu;
  in >> cpu;
  CpuTimes t;
  uint64_t v;
  for (int i = 0; i < 10 && in >> v; i++) {
    t.total += v;
    if (i != 3 && i != 4) t.busy += v;  // idle and iowait are not busy
  }
  return t;
}

// Each thread has its own default-device stack, so threads driving different devices do not see
// each other's scopes.
std::vector<Device>& default_stack() {
  thread_local std::vector<Device> stack;
  return stack;
}

}  // namespace

std::string Device::str() const {
  bool plain_cpu = kind == DeviceKind::cpu && index == 0 && detail::cpu_pools().empty();
  return plain_cpu ? "cpu" : std::string(kind_name(kind)) + ":" + std::to_string(index);
}

Device parse_device(std::string_view name) {
  std::string_view kind = name, idx;
  auto colon = name.find(':');
  if (colon != std::string_view::npos) {
    kind = name.substr(0, colon);
    idx = name.substr(colon + 1);
  }
  Device d;
  if (kind == "cpu")
    d.kind = DeviceKind::cpu;
  else if (kind == "opencl")
    d.kind = DeviceKind::opencl;
  else if (kind == "cuda" || kind == "gpu")
    d.kind = DeviceKind::cuda;
  else
    OPFORGE_CHECK(false) << "unknown device '" << name
                         << "': expected cpu, opencl:N or cuda:N (devices: " << known_devices()
                         << ")";
  if (colon != std::string_view::npos) {  // "cuda:" is an error, not cuda:0
    auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), d.index);
    OPFORGE_CHECK(ec == std::errc() && p == idx.data() + idx.size() && d.index >= 0)
        << "unknown device '" << name
        << "': the index after ':' must be a non-negative integer, as in cuda:0 (devices: "
        << known_devices() << ")";
  }
  check_exists(d, "parse_device");
  return d;
}

const std::vector<DeviceInfo>& devices() {
  static const std::vector<DeviceInfo> all = discover();
  return all;
}

bool device_exists(const Device& d) {
  for (const auto& i : devices())
    if (i.device == d) return true;
  return false;
}

int num_gpus() {
  int n = 0;
  for (const auto& i : devices()) n += i.device.kind == DeviceKind::cuda;
  return n;
}

bool gpu_is_available() { return num_gpus() > 0; }

int num_cpu_cores(bool logical) {
  if (logical) return int(std::thread::hardware_concurrency());
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::istringstream in(read_file("/proc/cpuinfo"));
  std::string phys = "0";
  for (std::string line; std::getline(in, line);) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  return cores.empty() ? int(std::thread::hardware_concurrency()) : int(cores.size());
}

uint64_t total_mem_on_dev(const Device& d) {
  check_exists(d, "total_mem_on_dev");
  for (const auto& i : devices())
    if (i.device == d) return i.total_memory;
  return 0;
}

uint64_t used_mem_on_dev(const Device& d, bool process_only) {
  check_exists(d, "used_mem_on_dev");
  switch (d.kind) {
    case DeviceKind::cpu: {
      if (!process_only) return (meminfo_kib("MemTotal") - meminfo_kib("MemAvailable")) * 1024;
      std::istringstream statm(read_file("/proc/self/statm"));
      uint64_t size = 0, resident = 0;
      statm >> size >> resident;
      return resident * uint64_t(sysconf(_SC_PAGESIZE));
    }
    case DeviceKind::cuda: {
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
      // In a container NVML reports the host's process ids, so this process may not be found:
      // it holds at least what its allocator reserved.
      const detail::DeviceMemory* mem = detail::device_memory(d);
      return std::max<uint64_t>(mine, mem ? mem->reserved() : 0);
    }
    case DeviceKind::opencl: {
      // OpenCL has no query for a device's memory in use: what this process holds there is the
      // best answer, for both questions.
      const detail::DeviceMemory* mem = detail::device_memory(d);
      return mem ? mem->reserved() : 0;
    }
  }
  return 0;
}

namespace {
detail::DeviceMemory& gpu_memory(const Device& d, const char* what) {
  check_exists(d, what);
  detail::DeviceMemory* mem = detail::device_memory(d);
  OPFORGE_CHECK(mem) << what << ": " << d.str()
                     << " holds no tensors (GPU memory is tracked on GPU devices in a build with "
                        "their kernels; host memory: used_mem_on_dev)";
  return *mem;
}
std::atomic<bool> soft_mode{false};
}  // namespace

uint64_t memory_allocated(const Device& d) { return gpu_memory(d, "memory_allocated").allocated(); }
uint64_t memory_reserved(const Device& d) { return gpu_memory(d, "memory_reserved").reserved(); }
void empty_cache(const Device& d) { gpu_memory(d, "empty_cache").empty_cache(); }
void set_memory_fraction(const Device& d, double fraction) {
  gpu_memory(d, "set_memory_fraction").set_fraction(fraction);
}
void set_soft_device_mode(bool on) { soft_mode = on; }
bool soft_device_mode() { return soft_mode; }

double percent_used_mem_on_dev(const Device& d, bool process_only) {
  uint64_t total = total_mem_on_dev(d);
  OPFORGE_CHECK(total > 0) << d.str() << ": the driver reports no memory, so no percentage of it";
  return 100.0 * double(used_mem_on_dev(d, process_only)) / double(total);
}

double dev_util(const Device& d) {
  check_exists(d, "dev_util");
  if (d.kind == DeviceKind::cuda) {
    Nvml::Utilization u{};
    OPFORGE_CHECK(nvml().utilization(nvml_handle(d), &u) == 0)
        << d.str() << ": NVML utilization query failed";
    return u.gpu;
  }
  const auto& pools = detail::cpu_pools();
  if (d.kind == DeviceKind::cpu && pools.empty()) {
    CpuTimes a = cpu_times();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CpuTimes b = cpu_times();
    uint64_t total = b.total - a.total;
    return total ? 100.0 * double(b.busy - a.busy) / double(total) : 0.0;
  }
  // A logical CPU device, or an OpenCL device (OpenCL has no utilization query): the share of time
  // its threads (the pool's workers, the queue's worker) spent running calls.
  double threads = d.kind == DeviceKind::cpu ? double(pools[size_t(d.index)]->cores().size()) : 1;
  auto busy = [&] {
    for (const auto& s : device_stats())
      if (s.device == d) return s.busy_seconds;
    return 0.0;
  };
  double b0 = busy();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::min(100.0, 100.0 * (busy() - b0) / (wall * threads));
}

Device default_device() {
  const auto& s = default_stack();
  return s.empty() ? Device{} : s.back();
}

void set_default_device(const Device& d) {
  check_exists(d, "set_default_device");
  default_stack().push_back(d);
}

bool default_device_is_set() { return !default_stack().empty(); }

size_t detail::default_device_depth() { return default_stack().size(); }

void detail::restore_default_device_depth(size_t depth) noexcept {
  auto& s = default_stack();
  if (s.size() > depth) s.resize(depth);
}

void unset_default_device() {
  auto& s = default_stack();
  OPFORGE_CHECK(!s.empty()) << "unset_default_device: no default device was set on this thread";
  s.pop_back();
}

std::vector<std::string> function_supported_devices(const std::string& op) {
  // A kernel's target names its device kind: the x86 feature levels are CPU kernels.
  std::set<std::string> kinds;
  for (const auto& [key, g] : op_info(op).groups)
    for (const auto& v : g.variants) {
      std::string t = v.kernel->target;
      kinds.insert(t == "avx512" || t == "avx2" || t == "sse41" ? "cpu" : t);
    }
  return {kinds.begin(), kinds.end()};
}

}  // namespace opforge
