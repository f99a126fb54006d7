// Caps on the host memory that tensors made on a CPU device's behalf may hold
// (set_memory_fraction on cpu or cpu:N, as PyTorch's on a GPU): a storage allocated while the
// thread's default device is a capped CPU device is charged to it until it is freed, and an
// allocation past the cap raises OutOfMemoryError as a GPU's would. Data-parallel training meets
// such a limit by splitting that device's share into micro-batches.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace opforge::detail {

extern std::atomic<bool> host_caps_set;  // any cap was ever set: until then nothing is charged
int charge_capped_cpu(size_t bytes);

// The CPU device an allocation of `bytes` on this thread is charged to (-1: none); throws
// OutOfMemoryError past that device's cap.
inline int charge_host_allocation(size_t bytes) {
  return host_caps_set.load(std::memory_order_relaxed) ? charge_capped_cpu(bytes) : -1;
}
void uncharge_host_allocation(int device, size_t bytes);
void set_host_cap(int device, uint64_t bytes);

}  // namespace opforge::detail
