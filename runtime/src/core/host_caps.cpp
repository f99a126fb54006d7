#include "core/host_caps.hpp"

#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "opforge/device.hpp"
#include "opforge/error.hpp"

namespace opforge::detail {

std::atomic<bool> host_caps_set{false};

namespace {
struct Cap {
  std::atomic<uint64_t> limit{std::numeric_limits<uint64_t>::max()};
  std::atomic<uint64_t> held{0};
};
// One per CPU device, made with the first cap (the devices are fixed by then).
struct Caps {
  std::unique_ptr<Cap[]> caps;
  size_t count = 0;
};
Caps& caps() {
  static Caps* c = [] {
    auto* out = new Caps;  // never destroyed: storages may be freed after other statics
    for (const DeviceInfo& d : devices()) out->count += d.device.kind == DeviceKind::cpu;
    out->caps = std::make_unique<Cap[]>(out->count);
    return out;
  }();
  return *c;
}
}  // namespace

int charge_capped_cpu(size_t bytes) {
  if (!default_device_is_set()) return -1;
  Device d = default_device();
  Caps& c = caps();
  if (d.kind != DeviceKind::cpu || size_t(d.index) >= c.count) return -1;
  Cap& cap = c.caps[size_t(d.index)];
  const uint64_t limit = cap.limit.load(std::memory_order_relaxed);
  if (limit == std::numeric_limits<uint64_t>::max()) return -1;
  uint64_t held = cap.held.fetch_add(bytes) + bytes;
  if (held > limit) {
    cap.held.fetch_sub(bytes);
    throw OutOfMemoryError(d.str() + ": out of memory allocating " + std::to_string(bytes) +
                           " bytes: tensors made on its behalf hold " +
                           std::to_string(held - bytes) + " of the " + std::to_string(limit) +
                           " bytes this process may use there (set_memory_fraction)");
  }
  return d.index;
}

void uncharge_host_allocation(int device, size_t bytes) {
  caps().caps[size_t(device)].held.fetch_sub(bytes);
}

void set_host_cap(int device, uint64_t bytes) {
  Caps& c = caps();
  OPFORGE_CHECK(device >= 0 && size_t(device) < c.count)
      << "set_memory_fraction: no CPU device " << device;
  c.caps[size_t(device)].limit.store(bytes);
  host_caps_set.store(true);
}

}  // namespace opforge::detail
