// Load measured from /proc: our threads' run and run-queue wait times, the cores' busy ticks.
#include "devices/cpu/load_meter.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "opforge/device.hpp"

namespace opforge::detail {

LoadMeter::LoadMeter(std::vector<int> cores, std::function<std::vector<int>()> threads)
    : cores_(std::move(cores)), threads_(std::move(threads)) {
  prev_ = take();
}

LoadMeter::Snapshot LoadMeter::take() const {
  Snapshot s;
  s.time =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::vector<int> tids = threads_ ? threads_() : std::vector<int>{};
  s.per_thread = !tids.empty();
  if (tids.empty()) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    s.run = double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  }
  for (int tid : tids) {
    // run time and run-queue wait time, in nanoseconds
    std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/schedstat");
    double run = 0, wait = 0;
    if (f >> run >> wait) {
      s.run += run * 1e-9;
      s.wait += wait * 1e-9;
    }
  }
  std::ifstream stat("/proc/stat");
  for (std::string line; std::getline(stat, line);) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !isdigit(line[3])) continue;
    std::istringstream in(line.substr(3));
    int cpu;
    in >> cpu;
    if (std::find(cores_.begin(), cores_.end(), cpu) == cores_.end()) continue;
    uint64_t v;
    for (int i = 0; i < 10 && in >> v; i++) {
      s.total += v;
      if (i != 3 && i != 4) s.busy += v;  // idle and iowait are not busy
    }
  }
  return s;
}

double LoadMeter::sample(double period) {
  std::lock_guard<std::mutex> lock(mu_);
  double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now - prev_.time < period) return factor_;
  Snapshot cur = take();
  double wall = (cur.time - prev_.time) * double(cores_.size());
  double run = cur.run - prev_.run, wait = cur.wait - prev_.wait;
  if (cur.per_thread && run > 0.2 * wall) {
    factor_ = (run + wait) / run;
  } else if (cur.total > prev_.total) {
    double busy = double(cur.busy - prev_.busy) / double(cur.total - prev_.total);
    factor_ = 1 + std::clamp(busy - run / wall, 0.0, 1.0);
  }
  prev_ = cur;
  return factor_;
}

double LoadMeter::last() const {
  std::lock_guard<std::mutex> lock(mu_);
  return factor_;
}

std::vector<int> all_cpu_cores() {
  std::vector<int> c(size_t(num_cpu_cores(true)));
  std::iota(c.begin(), c.end(), 0);
  return c;
}

}  // namespace opforge::detail
