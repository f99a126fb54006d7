// The device kinds of this build, in the order their devices are listed, and what every backend
// shares. A new kind is one line here and a folder with its discover function.
#include <chrono>
#include <thread>

#include "devices/backend.hpp"

namespace opforge::detail {

const std::vector<std::unique_ptr<Backend>>& backends() {
  static const auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<Backend>>;
    for (auto discover : {discover_cpu, discover_opencl, discover_cuda})
      for (auto& b : discover()) v->push_back(std::move(b));
    return v;
  }();
  return *all;
}

Backend* backend(const Device& d) {
  for (const auto& b : backends())
    if (b->device() == d) return b.get();
  return nullptr;
}

const char* kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::opencl:
      return "opencl";
    case DeviceKind::cuda:
      return "cuda";
  }
  return "?";
}

namespace {
int64_t steady_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
}  // namespace

void Backend::call_began() { running_since_ = steady_ns(); }

void Backend::call_ended(bool ran) {
  int64_t since = running_since_.exchange(0);
  if (ran && since) busy_ns_ += steady_ns() - since;
}

double Backend::busy_seconds() const {
  // A call still running counts up to now, so that a device busy with one long call shows it.
  int64_t since = running_since_.load(), busy = busy_ns_.load();
  if (since) busy += steady_ns() - since;
  return double(busy) * 1e-9;
}

double Backend::utilization() {
  double b0 = busy_seconds();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::min(100.0, 100.0 * (busy_seconds() - b0) / (wall * threads()));
}

}  // namespace opforge::detail
