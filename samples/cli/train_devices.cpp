#include "train_devices.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <sstream>

namespace opforge::cli {

std::vector<Device> device_list(const std::string& list) {
  std::vector<Device> out;
  if (list == "auto") {
    for (const DeviceStats& s : device_stats()) {
      bool on_host_cores = false;
      for (const DeviceInfo& i : devices())
        on_host_cores = on_host_cores || (i.device == s.device && i.shares_cpu_cores);
      if (!on_host_cores) out.push_back(s.device);
    }
    return out;
  }
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    OPFORGE_CHECK(!name.empty()) << "--devices: an empty device name in \"" << list << "\"";
    out.push_back(parse_device(name));
  }
  OPFORGE_CHECK(!out.empty()) << "--devices: no device in \"" << list << "\"";
  return out;
}

std::vector<std::pair<std::string, double>> shares_of(
    const std::vector<std::pair<std::string, int64_t>>& counts) {
  int64_t total = 0;
  for (const auto& [name, n] : counts) total += n;
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, n] : counts)
    out.emplace_back(name, double(n) / double(std::max<int64_t>(total, 1)));
  return out;
}

std::string percent_str(const std::vector<std::pair<std::string, double>>& shares) {
  std::ostringstream os;
  for (const auto& [name, f] : shares)
    os << (os.tellp() > 0 ? " " : "") << name << " " << std::fixed << std::setprecision(1)
       << 100.0 * f << "%";
  return os.str();
}

std::string split_str(const std::vector<Device>& devs, const std::vector<int64_t>& samples) {
  return percent_str(shares_of(named(devs, samples)));
}

std::vector<std::pair<std::string, int64_t>> named(const std::vector<Device>& devs,
                                                   const std::vector<int64_t>& samples) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < devs.size(); i++) out.emplace_back(devs[i].str(), samples[i]);
  return out;
}

std::string split_cores_for(const std::string& list) {
  if (const char* set = std::getenv("OPFORGE_CPU_DEVICES"); set && *set) return "";
  int wanted = 0;  // logical CPU devices named: one more than the highest index
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');)
    if (name.rfind("cpu:", 0) == 0) {
      char* end = nullptr;
      long index = std::strtol(name.c_str() + 4, &end, 10);
      if (end && *end == 0 && index >= 0 && index < 4096) wanted = std::max(wanted, int(index) + 1);
    }
  if (wanted < 2) return "";
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cores;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &allowed)) cores.push_back(c);
  OPFORGE_CHECK(int(cores.size()) >= wanted)
      << "--devices names " << wanted << " logical CPU devices, but this process may run on "
      << cores.size() << " core(s)";
  std::ostringstream os;
  for (int d = 0; d < wanted; d++) {
    size_t lo = cores.size() * size_t(d) / size_t(wanted),
           hi = cores.size() * size_t(d + 1) / size_t(wanted);
    os << (d ? ";" : "");
    for (size_t k = lo; k < hi; k++) os << (k > lo ? "," : "") << cores[k];
  }
  std::string spec = os.str();
  setenv("OPFORGE_CPU_DEVICES", spec.c_str(), 1);
  return spec;
}

Ranks::Ranks(const TrainOptions& o, torch::nn::Module& net, int64_t samples) {
  if (!o.distributed) return;
  torch::distributed::init();
  rank = torch::distributed::rank();
  world = torch::distributed::world_size();
  OPFORGE_CHECK(o.batch_size % world == 0)
      << "--batch-size " << o.batch_size << " is the batch of all ranks together: it must divide "
      << "by the " << world << " ranks";
  torch::distributed::broadcast(net.parameters());
  std::ostringstream agree;
  agree << o.model << " " << samples << " " << o.batch_size;
  for (const auto& [name, t] : net.named_parameters()) agree << " " << name << shape_str(t.shape());
  torch::distributed::check_same(std::hash<std::string>{}(agree.str()),
                                 "model, data or batch size");
  reducer = std::make_unique<torch::distributed::GradientReducer>(net.parameters());
}

}  // namespace opforge::cli
