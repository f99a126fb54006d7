// Logical CPU devices: OPFORGE_CPU_DEVICES ("0;1", "0-7;8-15") splits the cores into devices
// cpu:0, cpu:1, ..., each with its own thread pool pinned to its cores. Generated kernels reach the
// pool through their Halide user context and a custom halide_do_par_for.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace opforge::detail {

class CpuPool;

// The user context of every kernel call: the logical CPU device whose pool runs its parallel loops
// (null: Halide's default pool) and, for GPU calls, which OpenCL device or CUDA GPU runs it.
struct UserContext {
  CpuPool* pool = nullptr;
  int opencl = -1;
  int cuda = -1;
  std::string* error = nullptr;  // a kernel call's own slot for Halide's error text
};

class CpuPool {
 public:
  explicit CpuPool(std::vector<int> cores);
  ~CpuPool();
  // Runs f(ctx, i, closure) for i in [min, min + size) on this pool's threads; returns the first
  // non-zero result, as halide_do_par_for does.
  int parallel_for(void* ctx, int (*f)(void*, int, uint8_t*), int min, int size, uint8_t* closure);
  const std::vector<int>& cores() const { return cores_; }
  int64_t tasks() const { return tasks_.load(); }
  int64_t foreign_tasks() const { return foreign_.load(); }  // run on a core outside the set
  double busy_seconds() const { return double(busy_ns_.load()) * 1e-9; }
  std::vector<int> thread_ids() const;  // kernel thread ids of the workers

 private:
  struct Job;
  void worker();
  std::vector<int> cores_;
  std::vector<std::thread> threads_;
  std::vector<int> tids_;
  mutable std::mutex mu_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  uint64_t job_serial_ = 0;
  bool stop_ = false;
  std::mutex run_mu_;  // one parallel loop at a time per device
  std::atomic<int64_t> tasks_{0}, foreign_{0}, busy_ns_{0};
};

// How much a device's work is slowed down by work that is not ours, as a factor (1: nothing else
// runs there). While our threads run, it is their (running + waiting for a core) / running time
// from the kernel's scheduler statistics; while they idle, 1 + the share of the device's cores
// busy with other work (/proc/stat). Refreshed at most every `period` seconds.
class LoadMeter {
 public:
  // threads: our threads that run on the device's cores; empty means the whole process.
  LoadMeter(std::vector<int> cores, std::function<std::vector<int>()> threads);
  double sample(double period = 0.1);
  double last() const;

 private:
  struct Snapshot {
    double time = 0;
    double run = 0, wait = 0;      // seconds, of our threads
    bool per_thread = false;       // run and wait are our device threads' (else the process's)
    uint64_t busy = 0, total = 0;  // ticks of the device's cores, all processes
  };
  Snapshot take() const;
  std::vector<int> cores_;
  std::function<std::vector<int>()> threads_;
  mutable std::mutex mu_;
  Snapshot prev_;
  double factor_ = 1;
};

// The configured logical devices; empty when OPFORGE_CPU_DEVICES is unset (one device, "cpu",
// running on Halide's default pool).
const std::vector<std::unique_ptr<CpuPool>>& cpu_pools();
// Parses a spec such as "0;1" or "0-7;8-15" into core sets; throws an Error when malformed.
std::vector<std::vector<int>> parse_cpu_devices(const std::string& spec);

}  // namespace opforge::detail
