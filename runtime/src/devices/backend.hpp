// The interface every device kind implements, one folder each (devices/cpu, devices/opencl,
// devices/cuda): what the device is, how its kernel calls reach it, its memory and utilisation
// figures and, for devices with memory of their own, allocation, copies and synchronisation.
// Dispatch, storage coherence and the device API talk to devices only through it; a new device
// kind is a new folder with a discover function, listed once in backends.cpp.
#pragma once
#include <HalideRuntime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devices/cpu/load_meter.hpp"
#include "opforge/device.hpp"

namespace opforge::detail {

class CpuPool;
class DeviceMemory;

// The user context of every kernel call: the logical CPU device whose pool runs its parallel loops
// (null: Halide's default pool) and, for GPU calls, which OpenCL device or CUDA GPU runs it.
struct UserContext {
  CpuPool* pool = nullptr;
  int opencl = -1;
  int cuda = -1;
  std::string* error = nullptr;  // a kernel call's own slot for Halide's error text
};

// One allocation in a device's own memory: a one-dimensional byte buffer.
struct DeviceBlock {
  halide_buffer_t buf{};
  halide_dimension_t dim{};
  size_t capacity = 0;
  uint64_t raw = 0;  // the native handle: cl_mem or CUdeviceptr
};

// Room for what a kernel argument's `device` field points at while the call runs (Halide 14's
// OpenCL handle is {offset, cl_mem}; CUDA needs none).
struct DeviceHandle {
  uint64_t offset = 0;
  uint64_t mem = 0;
};

class Backend {
 public:
  explicit Backend(DeviceInfo info) : info_(std::move(info)) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const DeviceInfo& info() const { return info_; }
  const Device& device() const { return info_.device; }

  // ---- running kernels ----
  // Whether this build has kernels for it (a CUDA GPU in a build without CUDA kernels is listed
  // by the device API but runs nothing).
  virtual bool runs_kernels() const { return true; }
  // What its kernel calls get as their Halide user context (null: the plain CPU).
  virtual UserContext* user_context() { return nullptr; }
  // Calls placed here run on a queue of its own (a worker thread) rather than the caller's, and
  // that worker is pinned to these cores (empty: any).
  virtual bool queued() const { return true; }
  virtual std::vector<int> queue_cores() const { return {}; }
  // Measures the slowdown from work not ours there; `queue_thread`: the kernel thread id of its
  // queue's worker (-1: none). Null: nothing else runs there.
  virtual std::unique_ptr<LoadMeter> load_meter(int queue_thread) const {
    (void)queue_thread;
    return nullptr;
  }
  // Logical CPU devices: the pool that runs its parallel loops.
  virtual const CpuPool* pool() const { return nullptr; }

  // ---- memory and utilisation ----
  // Its own memory, where tensors placed there live (null: they live in host memory).
  virtual DeviceMemory* memory() { return nullptr; }
  virtual uint64_t used_memory(bool process_only) = 0;
  // Percent busy. By default: the share of a 50 ms window its calls ran (busy_seconds()).
  virtual double utilization();
  // Time spent running calls here: kept by the dispatcher for queued devices (call_began and
  // call_ended around each call), by the pool for logical CPU devices.
  virtual double busy_seconds() const;
  void call_began();
  // `ran`: the call ran to its end, so its time counts as busy.
  void call_ended(bool ran);

 protected:
  // The threads whose busy time utilization() divides by.
  virtual double threads() const { return 1; }

 private:
  DeviceInfo info_;
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<int64_t> running_since_{0};  // steady-clock ns when the running call began; 0: idle
};

// A device with memory of its own: the primitives DeviceMemory (gpu_memory.hpp) caches and counts.
// Work is asynchronous on the device's one in-order queue or stream; the host waits only in
// download() and the syncs.
class GpuBackend : public Backend {
 public:
  using Backend::Backend;
  // Allocates b.capacity bytes into `b` (buf already describes them); false when the device
  // refuses (its driver's text is in Halide's error slot).
  virtual bool allocate(DeviceBlock& b) = 0;
  virtual void free(DeviceBlock& b) = 0;
  virtual void upload(DeviceBlock& b, const void* src, size_t bytes) = 0;
  virtual void download(const DeviceBlock& b, void* dst, size_t bytes) = 0;
  // n bytes between blocks on this device, at any offsets.
  virtual void copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst, size_t dst_offset,
                    size_t n) = 0;
  // Points `buf` (its type and dims already set) at `b` from byte `offset`; `h` must outlive the
  // use of `buf`. False when the device cannot address that offset in place.
  virtual bool bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset,
                    DeviceHandle& h) const = 0;
  // Waits for everything queued on the device.
  virtual void sync_all() = 0;
  DeviceMemory* memory() override { return memory_.get(); }

 protected:
  std::unique_ptr<DeviceMemory> memory_;  // made by the kind's constructor
};

// Every device found at start-up, the CPU devices first; never destroyed (kernels may still run
// at exit).
const std::vector<std::unique_ptr<Backend>>& backends();
// The backend of `d`, or null when there is no such device.
Backend* backend(const Device& d);
const char* kind_name(DeviceKind k);

// Each kind's discovery (its folder): the devices of that kind on this machine, none when its
// driver is missing.
std::vector<std::unique_ptr<Backend>> discover_cpu();
std::vector<std::unique_ptr<Backend>> discover_opencl();
std::vector<std::unique_ptr<Backend>> discover_cuda();

}  // namespace opforge::detail
