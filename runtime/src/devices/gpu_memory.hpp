// The memory behind tensors on a device with memory of its own: one caching allocator per device
// over its backend's primitives (freed blocks wait by size class for reuse; an allocation that
// fails empties the cache, then evicts copies, and retries before it raises an OutOfMemoryError
// naming the device, the request and what is in use), the copies, counted and timed, and the
// eviction of copies under memory pressure.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "devices/backend.hpp"
#include "opforge/device.hpp"

namespace opforge {
struct Storage;
}

namespace opforge::detail {

class DeviceMemory {
 public:
  explicit DeviceMemory(GpuBackend& backend);
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  const Device& device() const { return backend_.device(); }
  GpuBackend& backend() { return backend_; }
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
  bool bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset, DeviceHandle& h) const {
    return backend_.bind(buf, b, offset, h);
  }
  // Waits for everything queued on the device.
  void sync_all() { backend_.sync_all(); }
  // Measured bytes per second of host<->device copies (a prior until something was copied).
  double bandwidth() const { return bandwidth_.load(std::memory_order_relaxed); }
  // Bytes copied so far from the host (to_device) or back to it.
  uint64_t bytes_copied(bool to_device) const { return copied_[to_device].load(); }

 private:
  void count(bool to_device, size_t bytes, double seconds);
  // Evicts copies (Storage::evict), least recently used first, until `fits()` (tried each time
  // enough was freed for `bytes`) says the allocation went through; false if it never did.
  bool evict_until(const Storage* skip, size_t bytes, const std::function<bool()>& fits);
  GpuBackend& backend_;
  uint64_t total_;
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
};

// The memory of a device with its own that runs kernels in this build (opencl:0, cuda:0), or null.
DeviceMemory* device_memory(const Device& d);
// A byte buffer of `bytes` in `b` (with its one dimension in `dim`); an Error above 2 GiB.
void byte_buffer(halide_buffer_t& b, halide_dimension_t& dim, size_t bytes);
std::string human_bytes(double bytes);

}  // namespace opforge::detail
