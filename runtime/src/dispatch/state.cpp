// The dispatcher's state: the devices that run kernels (the plain CPU or the logical CPU devices,
// then the GPUs whose memory the runtime manages), the load sampler, and the settings that
// tests and users change (forced variant, clock, policies).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "devices/cpu/cpu_pool.hpp"
#include "dispatch/dispatch_state.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace detail {
namespace {

// OPFORGE_AUTO_CPU_OPENCL=1: automatic placement also uses OpenCL devices that run on the host's
// cores (PoCL), which it otherwise leaves to the calls pinned there; the GPU placement paths can
// then run on a machine without a GPU.
bool auto_cpu_opencl() {
  const char* v = std::getenv("OPFORGE_AUTO_CPU_OPENCL");
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw Error("OPFORGE_AUTO_CPU_OPENCL: '" + std::string(v) + "' is not 0 or 1");
}

}  // namespace

// OPFORGE_LOG is a comma-separated list of what to log ("dispatch").
bool log_enabled(std::string_view what) {
  const char* v = std::getenv("OPFORGE_LOG");
  std::istringstream items(v ? v : "");
  for (std::string item; std::getline(items, item, ',');)
    if (item == what) return true;
  return false;
}

DevicePolicy initial_device_policy() {
  const char* v = std::getenv("OPFORGE_DEVICE_POLICY");
  if (!v || !*v || std::string(v) == "auto") return DevicePolicy::automatic;
  if (std::string(v) == "round_robin") return DevicePolicy::round_robin;
  throw Error("OPFORGE_DEVICE_POLICY: '" + std::string(v) + "' is not auto or round_robin");
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

State::State() {
  if (const char* v = std::getenv("OPFORGE_VARIANT")) forced = v;
  any_forced = !forced.empty();
  install_halide_error_handler();
  for (const auto& b : backends()) {
    if (!b->runs_kernels()) continue;
    auto d = std::make_unique<ExecDevice>();
    d->device = b->device();
    d->backend = b.get();
    d->mem = b->memory();
    d->user_context = b->user_context();
    // An OpenCL device on the host's cores (PoCL) competes with the CPU devices for them:
    // automatic placement leaves it to the calls pinned there unless asked.
    d->in_auto = !b->info().shares_cpu_cores || auto_cpu_opencl();
    if (b->queued())
      d->queue = std::make_unique<DeviceQueue>(int(devices.size()), b->queue_cores());
    d->meter = b->load_meter(d->queue ? d->queue->thread_id() : -1);
    if (d->in_auto) auto_devices.push_back(int(devices.size()));
    devices.push_back(std::move(d));
  }
  sched.set_device_count(std::max<int>(1, int(devices.size())));
  // Queued calls hold tensors and kernels: let them finish before the process tears down.
  std::atexit([] {
    try {
      synchronize_quietly();
    } catch (const std::exception& e) {  // a device that fails now has no caller left to tell
      std::fprintf(stderr, "opforge: at exit: %s\n", e.what());
    }
  });
  // Load is sampled here, at a fixed rate, never by a caller: a call reads the last sample.
  std::vector<LoadMeter*> meters;
  for (auto& d : devices)
    if (d->meter) meters.push_back(d->meter.get());
  if (!meters.empty())
    std::thread([meters] {
      for (;;) {
        for (LoadMeter* m : meters) m->sample();
        std::this_thread::sleep_for(std::chrono::milliseconds(kLoadSampleMs));
      }
    }).detach();
}

// Never destroyed: queued work may still run while other statics are torn down.
State& state() {
  static State* s = new State;
  return *s;
}

void State::synchronize_quietly() {
  for (auto& d : state().devices)
    if (d->queue) d->queue->drain();
  // GPU kernels run on after their queued call ends (dispatch.cpp, run_queued).
  for (auto& d : state().devices)
    if (d->mem && d->backlog_until.load() > 0) d->mem->sync_all();
}

}  // namespace detail

void set_clock(Clock clock) {
  detail::State& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock = std::move(clock);
  s.any_clock = bool(s.clock);
}

void force_variant(const std::string& name, const std::string& op) {
  detail::State& s = detail::state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.forced = name;
    s.forced_op = name.empty() ? std::string() : op;
    s.any_forced = !name.empty();
  }
  s.sched.reset();
}

std::string forced_variant() {
  detail::State& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.forced;
}

void set_dispatch_policy(const DispatchPolicy& p) { detail::state().sched.set_policy(p); }

void reset_performance_model() {
  detail::State& s = detail::state();
  s.sched.reset();
  detail::reset_call_stats();
}

void set_device_policy(DevicePolicy p) { detail::state().device_policy = p; }

DevicePolicy device_policy() { return detail::state().device_policy; }

std::vector<DeviceStats> device_stats() {
  detail::State& s = detail::state();
  std::vector<DeviceStats> out;
  double now = detail::steady_seconds();
  for (size_t i = 0; i < s.devices.size(); i++) {
    const detail::ExecDevice& d = *s.devices[i];
    DeviceStats st;
    st.device = d.device;
    st.kernel_calls = detail::kernel_runs(int(i));
    st.queue_length = s.sched.queue_length(int(i));
    st.queued_seconds = s.sched.ready_in(int(i), now);
    st.load = d.meter ? d.meter->last() : 1.0;
    st.busy_seconds = d.backend->busy_seconds();
    if (d.mem) {
      st.device_bytes = d.mem->allocated();
      st.bytes_to_device = d.mem->bytes_copied(true);
      st.bytes_from_device = d.mem->bytes_copied(false);
    }
    if (const detail::CpuPool* pool = d.backend->pool()) {
      st.tasks = pool->tasks();
      st.foreign_core_tasks = pool->foreign_tasks();
    }
    out.push_back(st);
  }
  return out;
}
}  // namespace opforge
