// Devices and the device API users know from unified frameworks: discovery, memory and utilization
// queries, and a default-device stack with an RAII scope. OPFORGE_CPU_DEVICES ("0;1", "0-7;8-15")
// splits the CPU into logical devices cpu:0, cpu:1, ... with their own thread pools. GPU drivers
// (NVML, OpenCL ICD) are loaded dynamically: a machine without them simply has no such devices.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

enum class DeviceKind { cpu, opencl, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  std::string str() const;  // "cpu", "opencl:0", "cuda:1"
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

// Parses "cpu", "cpu:0", "opencl:N", "cuda:N" ("gpu:N" means "cuda:N"). Throws an Error for a
// malformed name and for a device this machine does not have, listing the ones it has.
Device parse_device(std::string_view name);

struct DeviceInfo {
  Device device;
  std::string name;       // model or platform name
  uint64_t total_memory;  // bytes
  int cores = 0;          // CPU devices: how many cores it runs on
  // An OpenCL device that runs on the host's cores (PoCL): automatic placement leaves it out, as
  // it competes with the CPU devices for the same cores; calls pinned to it run there.
  bool shares_cpu_cores = false;
};
// Every device found at start-up, the CPU first.
const std::vector<DeviceInfo>& devices();
bool device_exists(const Device& d);

int num_gpus();  // CUDA GPUs visible through NVML
bool gpu_is_available();
int num_cpu_cores(bool logical = true);

// Memory in bytes. process_only: what this process holds (CPU: resident set; CUDA: this process's
// allocations as NVML reports them).
uint64_t total_mem_on_dev(const Device& d);
uint64_t used_mem_on_dev(const Device& d, bool process_only = false);
double percent_used_mem_on_dev(const Device& d, bool process_only = false);
// GPU memory this process's tensors hold (PyTorch's memory_allocated), and that plus what the
// caching allocator keeps for reuse (memory_reserved). An Error for a device that holds no tensors.
uint64_t memory_allocated(const Device& d);
uint64_t memory_reserved(const Device& d);
// Gives the allocator's cached blocks on `d` back to the driver.
void empty_cache(const Device& d);
// Caps the GPU memory this process may hold on `d` at a fraction of the device's (PyTorch's
// set_per_process_memory_fraction); an allocation beyond it raises an OutOfMemoryError. On a CPU
// device (cpu, cpu:N) it caps the host memory of the tensors made while it is a thread's default
// device, from then until they are freed, at that fraction of the machine's memory: a logical
// device's share of memory, as data-parallel training meets it with micro-batches.
void set_memory_fraction(const Device& d, double fraction);

// Utilization in percent: CPU from /proc/stat over a 50 ms window, CUDA from NVML.
double dev_util(const Device& d);

// The device ops run on when nothing else decides (no input lives on a GPU device): the top of this
// thread's stack, cpu when empty. Tensors are created on the host whatever the default device.
Device default_device();
void set_default_device(const Device& d);  // pushes
void unset_default_device();               // pops; an Error when the stack is empty
// True while this thread has a default device set: op calls are pinned to it. Otherwise the
// device policy (dispatch.hpp) places each call.
bool default_device_is_set();

// Soft device mode (process-wide, off by default). A call whose inputs live on two GPU devices, or
// on a GPU device other than the default one, raises an Error while it is off; while it is on, the
// inputs are copied to the default device and the call runs there.
void set_soft_device_mode(bool on);
bool soft_device_mode();

namespace detail {
size_t default_device_depth();
// Pops the default-device stack down to `depth` entries (no-op if it is already shallower).
void restore_default_device_depth(size_t depth) noexcept;
}  // namespace detail

// Makes `d` the default device for its lifetime; scopes nest. On exit the stack is as it was on
// entry, whatever was set or unset inside the scope.
class DefaultDevice {
 public:
  explicit DefaultDevice(const Device& d) : depth_(detail::default_device_depth()) {
    set_default_device(d);
  }
  explicit DefaultDevice(std::string_view name) : DefaultDevice(parse_device(name)) {}
  ~DefaultDevice() { detail::restore_default_device_depth(depth_); }
  DefaultDevice(const DefaultDevice&) = delete;
  DefaultDevice& operator=(const DefaultDevice&) = delete;

 private:
  size_t depth_;
};

// The state of each device that runs kernels, as `opforge info --load` shows it.
struct DeviceStats {
  Device device;
  int64_t kernel_calls = 0;        // kernels run there
  int queue_length = 0;            // calls submitted and not finished (asynchronous devices)
  double queued_seconds = 0;       // predicted time of that queued work
  double load = 1;                 // measured slowdown from work not ours (1: unloaded)
  int64_t tasks = 0;               // logical CPU devices: parallel-loop iterations run by its pool
  int64_t foreign_core_tasks = 0;  // of those, run on a core outside the device (should be 0)
  double busy_seconds = 0;         // time its threads spent running kernels
  uint64_t device_bytes = 0;       // GPU devices: memory held by tensors there (memory_allocated)
  uint64_t bytes_to_device = 0;    // GPU devices: bytes copied from the host so far
  uint64_t bytes_from_device = 0;  // GPU devices: bytes copied back to the host so far
};
std::vector<DeviceStats> device_stats();

// The device kinds some variant of the op runs on ("cpu" today; GPU kinds with their kernels).
std::vector<std::string> function_supported_devices(const std::string& op);

}  // namespace opforge
