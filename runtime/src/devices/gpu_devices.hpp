// GPU devices as the runtime drives them. The memory behind GPU tensors: one caching allocator per
// device (freed blocks wait by size class for reuse; an allocation that fails empties the cache and
// retries before it raises an OutOfMemoryError naming the device, the request and what is in use),
// the copies between host and device, and the Halide device handles that point a kernel argument at
// any byte of a block. Each OpenCL device also gets its own context (gpu_devices.cpp).
#pragma once
#include <HalideRuntime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "devices/cpu_devices.hpp"
#include "opforge/device.hpp"

namespace opforge {
struct Storage;
}

namespace opforge::detail {

// One allocation on a device: a one-dimensional byte buffer that halide_device_free releases.
struct DeviceBlock {
  halide_buffer_t buf{};
  halide_dimension_t dim{};
  size_t capacity = 0;
  uint64_t raw = 0;  // the native handle: cl_mem or CUdeviceptr
};

// What a buffer's `device` field points at on OpenCL: Halide 14's handle is {offset, cl_mem}, and a
// non-zero offset becomes a sub-buffer when the kernel runs.
struct DeviceHandle {
  uint64_t offset = 0;
  uint64_t mem = 0;
};

class DeviceMemory {
 public:
  DeviceMemory(const Device& d, const halide_device_interface_t* iface, uint64_t total,
               size_t offset_align);
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  const Device& device() const { return device_; }
  // The user context of Halide calls for this device (it selects the OpenCL device).
  UserContext* user_context() { return &context_; }
  // `for_storage`: the storage the block is for, whose lock the caller holds (eviction skips it).
  DeviceBlock* allocate(size_t bytes, const Storage* for_storage = nullptr);
  void release(DeviceBlock* b);
  void empty_cache();
  size_t allocated() const { return allocated_; }  // held by tensors
  size_t reserved() const;                         // held by tensors and by the cache
  // Caps what this process may hold there, as a fraction of the device's memory (PyTorch's
  // set_per_process_memory_fraction).
  void set_fraction(double fraction);

  // The storages with a copy here, which allocate() may evict from under memory pressure;
  // remember() on each use, so that the least recently used go first.
  void remember(Storage* s);
  void forget(Storage* s);

  void upload(DeviceBlock& b, const void* src, size_t bytes);
  void download(const DeviceBlock& b, void* dst, size_t bytes);
  // Copies n bytes between blocks on this device, at any offsets.
  void copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst, size_t dst_offset,
            size_t n);
  // Points `buf` (its type and dims already set) at `b` from byte `offset`; `h` must outlive the
  // use of `buf`. False when the device cannot address that offset in place (an OpenCL sub-buffer
  // must start at a multiple of the device's base address alignment).
  bool bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset, DeviceHandle& h) const;
  // Waits for the work queued on the device (Halide asks for a buffer there to know which).
  void sync(halide_buffer_t& on_device);
  // Waits for everything queued on the device.
  void sync_all();
  // Measured bytes per second of host<->device copies (a prior until something was copied).
  double bandwidth() const { return bandwidth_.load(std::memory_order_relaxed); }
  // Bytes copied so far from the host (to_device) or back to it.
  uint64_t bytes_copied(bool to_device) const { return copied_[to_device].load(); }

 private:
  void transfer(halide_buffer_t& host_side, const DeviceBlock& b, bool to_device, size_t bytes);
  // Evicts copies (Storage::evict), least recently used first, until `fits()` (tried each time
  // enough was freed for `bytes`) says the allocation went through; false if it never did.
  bool evict_until(const Storage* skip, size_t bytes, const std::function<bool()>& fits);
  Device device_;
  UserContext context_;
  const halide_device_interface_t* iface_;
  uint64_t total_;
  size_t align_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<DeviceBlock*>> free_;
  std::mutex holders_mu_;  // taken before any Storage's lock, which evict() only tries
  std::unordered_map<Storage*, uint64_t> holders_;  // storage -> its last use (use_clock_)
  uint64_t use_clock_ = 0;
  size_t cached_ = 0;
  std::atomic<size_t> allocated_{0};
  std::atomic<size_t> limit_;
  std::atomic<double> bandwidth_{8e9};
  std::atomic<uint64_t> copied_[2] = {0, 0};  // [to_device]
  std::once_flag fence_once_;
  DeviceBlock fence_;  // what sync_all() names the device by
  bool fence_ok_ = false;
};

// The memory of a GPU device that runs kernels in this build (opencl:0, cuda:0), or null.
DeviceMemory* device_memory(const Device& d);
// The OpenCL driver, as device.cpp opened it: CL_DEVICE_MEM_BASE_ADDR_ALIGN of opencl:N in bytes,
// the cl_device_id behind opencl:N (null if none), an entry point by name (null if absent).
size_t opencl_offset_align(int index);
void* opencl_device_id(int index);
void* opencl_function(const char* name);
// A function of the CUDA driver (libcuda.so.1) as device.cpp opened it, or null.
void* cuda_function(const char* name);

}  // namespace opforge::detail
