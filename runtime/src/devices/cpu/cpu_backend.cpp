// The CPU device kind: the plain CPU (Halide's own thread pool, calls on the caller's thread) or
// the logical CPU devices of OPFORGE_CPU_DEVICES (a pool and a queue each). Tensors there live in
// host memory; figures come from /proc.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "devices/backend.hpp"
#include "devices/cpu/cpu_pool.hpp"
#include "devices/cpu/load_meter.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace detail {
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

class CpuBackend final : public Backend {
 public:
  // pool null: the plain CPU.
  CpuBackend(DeviceInfo info, CpuPool* pool) : Backend(std::move(info)), pool_(pool) {
    context_.pool = pool;
  }
  UserContext* user_context() override { return pool_ ? &context_ : nullptr; }
  bool queued() const override { return pool_ != nullptr; }
  std::vector<int> queue_cores() const override {
    return pool_ ? pool_->cores() : std::vector<int>{};
  }
  std::unique_ptr<LoadMeter> load_meter(int queue_thread) const override {
    if (!pool_) return std::make_unique<LoadMeter>(all_cpu_cores(), nullptr);
    CpuPool* pool = pool_;
    return std::make_unique<LoadMeter>(pool->cores(), [pool, queue_thread] {
      std::vector<int> t = pool->thread_ids();
      if (queue_thread >= 0) t.push_back(queue_thread);
      return t;
    });
  }
  const CpuPool* pool() const override { return pool_; }

  uint64_t used_memory(bool process_only) override {
    if (!process_only) return (meminfo_kib("MemTotal") - meminfo_kib("MemAvailable")) * 1024;
    std::istringstream statm(read_file("/proc/self/statm"));
    uint64_t size = 0, resident = 0;
    statm >> size >> resident;
    return resident * uint64_t(sysconf(_SC_PAGESIZE));
  }
  double utilization() override {
    if (pool_) return Backend::utilization();  // the share of time its pool's threads ran calls
    CpuTimes a = cpu_times();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CpuTimes b = cpu_times();
    uint64_t total = b.total - a.total;
    return total ? 100.0 * double(b.busy - a.busy) / double(total) : 0.0;
  }
  double busy_seconds() const override {
    return pool_ ? pool_->busy_seconds() : Backend::busy_seconds();
  }

 protected:
  double threads() const override { return pool_ ? double(pool_->cores().size()) : 1; }

 private:
  CpuPool* pool_;
  UserContext context_;
};

}  // namespace

std::vector<std::unique_ptr<Backend>> discover_cpu() {
  std::vector<std::unique_ptr<Backend>> out;
  std::string cpu_name = "cpu";
  std::istringstream cpuinfo(read_file("/proc/cpuinfo"));
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu_name = line.substr(line.find(':') + 2);
      break;
    }
  uint64_t ram = meminfo_kib("MemTotal") * 1024;
  const auto& pools = cpu_pools();
  if (pools.empty())
    out.push_back(std::make_unique<CpuBackend>(
        DeviceInfo{{DeviceKind::cpu, 0}, cpu_name, ram, num_cpu_cores(true)}, nullptr));
  for (size_t i = 0; i < pools.size(); i++) {
    std::string cores;
    for (int c : pools[i]->cores()) {
      if (!cores.empty()) cores += ",";
      cores += std::to_string(c);
    }
    out.push_back(std::make_unique<CpuBackend>(DeviceInfo{{DeviceKind::cpu, int(i)},
                                                          cpu_name + " (cores " + cores + ")",
                                                          ram,
                                                          int(pools[i]->cores().size())},
                                               pools[i].get()));
  }
  return out;
}

}  // namespace detail

int num_cpu_cores(bool logical) {
  if (logical) return int(std::thread::hardware_concurrency());
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::istringstream in(detail::read_file("/proc/cpuinfo"));
  std::string phys = "0";
  for (std::string line; std::getline(in, line);) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  return cores.empty() ? int(std::thread::hardware_concurrency()) : int(cores.size());
}

}  // namespace opforge
