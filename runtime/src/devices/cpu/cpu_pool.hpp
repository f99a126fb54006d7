// The thread pools of logical CPU devices: OPFORGE_CPU_DEVICES ("0;1", "0-7;8-15") splits the cores
// into devices cpu:0, cpu:1, ..., each with its own pool pinned to its cores. Generated kernels
// reach the pool through their Halide user context (UserContext::pool) and a custom
// halide_do_par_for.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace opforge::detail {

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
  void run_tasks(Job& job);
  bool caller_on_cores() const;  // the calling thread may run only on this pool's cores
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

// The configured logical devices; empty when OPFORGE_CPU_DEVICES is unset (one device, "cpu",
// running on Halide's default pool).
const std::vector<std::unique_ptr<CpuPool>>& cpu_pools();
// Parses a spec such as "0;1" or "0-7;8-15" into core sets; throws an Error when malformed.
std::vector<std::vector<int>> parse_cpu_devices(const std::string& spec);

}  // namespace opforge::detail
