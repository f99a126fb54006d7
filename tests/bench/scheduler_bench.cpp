// The scheduler benchmark: one stream, several placement policies, measured in turns so that every
// policy sees the same machine state.
#include "scheduler_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <optional>

#include "external_load.hpp"
#include "opforge/device.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/error.hpp"
#include "opforge/ops.hpp"
#include "timing.hpp"

namespace opforge::cli {
namespace {

// The stream: even items are matmuls of three sizes, odd items elementwise chains of three sizes.
struct Inputs {
  std::vector<Tensor> a, b, x;
  Inputs() {
    Generator g(2026);
    for (int64_t n : {128, 256, 320}) {
      a.push_back(Tensor::randn({n, n}, DType::Float32, g));
      b.push_back(Tensor::randn({n, n}, DType::Float32, g));
    }
    for (int64_t n : {int64_t(1) << 16, int64_t(1) << 17, int64_t(1) << 18})
      x.push_back(Tensor::randn({n}, DType::Float32, g));
  }
};

bool is_matmul(int item) { return item % 2 == 0; }

Tensor run_item(const Inputs& in, int item) {
  size_t k = size_t(item / 2) % 3;
  if (is_matmul(item)) return matmul(in.a[k], in.b[k]);
  return tanh(add(mul(in.x[k], 0.5), 0.25));
}

std::vector<int64_t> kernel_calls() {
  std::vector<int64_t> out;
  for (const auto& s : device_stats()) out.push_back(s.kernel_calls);
  return out;
}

struct Policy {
  std::string name;
  DevicePolicy device_policy = DevicePolicy::automatic;
  std::function<std::optional<Device>(int)> pin;  // empty: not pinned
};

// One pass over the stream; returns items per second and adds the calls per device to `calls`.
double run_pass(const Inputs& in, const Policy& p, const SchedulerBenchOptions& o,
                std::vector<int64_t>& calls) {
  set_device_policy(p.device_policy);
  std::vector<int64_t> before = kernel_calls();
  std::deque<Tensor> in_flight;
  double t0 = now_seconds();
  for (int i = 0; i < o.items; i++) {
    std::optional<DefaultDevice> scope;
    if (p.pin) scope.emplace(*p.pin(i));
    in_flight.push_back(run_item(in, i));
    if (int(in_flight.size()) > o.window) {
      in_flight.front().data();  // a host read waits for that item
      in_flight.pop_front();
    }
  }
  synchronize();
  double seconds = now_seconds() - t0;
  std::vector<int64_t> after = kernel_calls();
  for (size_t d = 0; d < after.size() && d < calls.size(); d++) calls[d] += after[d] - before[d];
  set_device_policy(DevicePolicy::automatic);
  return double(o.items) / seconds;
}

}  // namespace

SchedulerBenchResult run_scheduler_bench(const SchedulerBenchOptions& o) {
  std::vector<Device> cpus;
  for (const auto& s : device_stats())
    if (s.device.kind == DeviceKind::cpu) cpus.push_back(s.device);
  OPFORGE_CHECK(cpus.size() >= 2)
      << "bench --scheduler needs two logical CPU devices; set OPFORGE_CPU_DEVICES, for example "
         "\"0;1\" (found "
      << cpus.size() << ")";
  OPFORGE_CHECK(o.items >= 2 && o.repeats >= 1 && o.window >= 1)
      << "bench --scheduler: items, repeats and window must be positive";
  OPFORGE_CHECK(o.loaded_device >= 0 && o.loaded_device < 2)
      << "bench --scheduler: the loaded device is cpu:0 or cpu:1";
  cpus.resize(2);

  std::vector<Policy> policies = {{"auto", DevicePolicy::automatic, {}},
                                  {"round_robin", DevicePolicy::round_robin, {}}};
  for (int mm = 0; mm < 2; mm++)
    for (int ew = 0; ew < 2; ew++) {
      Device dm = cpus[size_t(mm)], de = cpus[size_t(ew)];
      policies.push_back(
          {"fixed mm->" + dm.str() + " ew->" + de.str(), DevicePolicy::automatic,
           [dm, de](int i) { return std::optional<Device>(is_matmul(i) ? dm : de); }});
    }

  Inputs in;
  std::optional<ExternalLoad> load;
  if (o.external_load) {
    load.emplace(first_core_of(o.loaded_device));
  }

  // Warm-up: calibrates every bucket on both devices (the model is shared by all policies).
  std::vector<int64_t> ignore(cpus.size());
  for (int i = 0; i < 2; i++) run_pass(in, policies[0], o, ignore);
  for (const auto& p : policies) run_pass(in, p, o, ignore);

  std::vector<std::vector<double>> rates(policies.size());
  std::vector<std::vector<int64_t>> calls(policies.size(), std::vector<int64_t>(cpus.size()));
  for (int r = 0; r < o.repeats; r++)
    for (size_t k = 0; k < policies.size(); k++)
      rates[k].push_back(run_pass(in, policies[k], o, calls[k]));

  SchedulerBenchResult out;
  double best_fixed = 0, rr = 0, automatic = 0;
  for (size_t k = 0; k < policies.size(); k++) {
    PolicyResult pr{policies[k].name, median(rates[k]), {}};
    int64_t total = 0;
    for (int64_t c : calls[k]) total += c;
    for (int64_t c : calls[k]) pr.share.push_back(total ? double(c) / double(total) : 0);
    if (k == 0) automatic = pr.items_per_second;
    if (k == 1) rr = pr.items_per_second;
    if (k >= 2 && pr.items_per_second > best_fixed) {
      best_fixed = pr.items_per_second;
      out.best_fixed = pr.policy;
    }
    out.policies.push_back(pr);
  }
  out.vs_round_robin = automatic / rr;
  out.vs_best_fixed = automatic / best_fixed;
  return out;
}

}  // namespace opforge::cli
