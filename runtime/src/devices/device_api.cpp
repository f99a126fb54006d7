// The device API (device.hpp) over the backends of the device kinds (backend.hpp): discovery,
// names, memory and utilisation queries, the default-device stack and soft device mode.
#include <atomic>
#include <charconv>
#include <set>

#include "core/host_caps.hpp"
#include "devices/backend.hpp"
#include "devices/cpu/cpu_pool.hpp"
#include "devices/gpu_memory.hpp"
#include "opforge/device.hpp"
#include "opforge/error.hpp"
#include "opforge/registry.hpp"

namespace opforge {
namespace {

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

// Each thread has its own default-device stack, so threads driving different devices do not see
// each other's scopes.
std::vector<Device>& default_stack() {
  thread_local std::vector<Device> stack;
  return stack;
}

}  // namespace

std::string Device::str() const {
  bool plain_cpu = kind == DeviceKind::cpu && index == 0 && detail::cpu_pools().empty();
  return plain_cpu ? "cpu" : std::string(detail::kind_name(kind)) + ":" + std::to_string(index);
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
  // Never destroyed, like the backends: threads may still ask while the process exits.
  static const auto* all = [] {
    auto* v = new std::vector<DeviceInfo>;
    for (const auto& b : detail::backends()) v->push_back(b->info());
    return v;
  }();
  return *all;
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

uint64_t total_mem_on_dev(const Device& d) {
  check_exists(d, "total_mem_on_dev");
  for (const auto& i : devices())
    if (i.device == d) return i.total_memory;
  return 0;
}

uint64_t used_mem_on_dev(const Device& d, bool process_only) {
  check_exists(d, "used_mem_on_dev");
  return detail::backend(d)->used_memory(process_only);
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
  OPFORGE_CHECK(fraction > 0 && fraction <= 1)
      << "set_memory_fraction: " << fraction << " is not in (0, 1]";
  if (d.kind == DeviceKind::cpu) {
    check_exists(d, "set_memory_fraction");
    detail::set_host_cap(d.index, uint64_t(fraction * double(total_mem_on_dev(d))));
    return;
  }
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
  return detail::backend(d)->utilization();
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
