// How busy the cores of a device are with work that is not ours, read from the kernel's scheduler
// statistics (/proc): the placement model divides a device's speed by it.
#pragma once
#include <functional>
#include <mutex>
#include <vector>

namespace opforge::detail {

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

// Every core of the machine, for a meter of the whole host.
std::vector<int> all_cpu_cores();

}  // namespace opforge::detail
