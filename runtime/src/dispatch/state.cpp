// The dispatcher's state: the devices that run kernels (the plain CPU or the logical CPU devices,
// then the GPUs whose memory the runtime manages), the load sampler, and the settings that
// tests and users change (forced variant, clock, policies).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

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
  const auto& pools = cpu_pools();
  std::vector<int> all_cores(static_cast<size_t>(num_cpu_cores(true)));
  for (size_t i = 0; i < all_cores.size(); i++) all_cores[i] = int(i);
  if (pools.empty()) {
    auto d = std::make_unique<ExecDevice>();
    d->meter = std::make_unique<LoadMeter>(all_cores, nullptr);
    devices.push_back(std::move(d));
  }
  for (size_t i = 0; i < pools.size(); i++) {
    auto d = std::make_unique<ExecDevice>();
    d->device = {DeviceKind::cpu, int(i)};
    d->pool = pools[i].get();
    d->cpu_context.pool = d->pool;
    d->user_context = &d->cpu_context;
    d->queue = std::make_unique<DeviceQueue>(int(i), pools[i]->cores());
    CpuPool* pool = d->pool;
    int queue_tid = d->queue->thread_id();
    d->meter = std::make_unique<LoadMeter>(pool->cores(), [pool, queue_tid] {
      std::vector<int> t = pool->thread_ids();
      t.push_back(queue_tid);
      return t;
    });
    devices.push_back(std::move(d));
  }
  // GPU devices: each has a queue; an OpenCL device on the host's cores (PoCL) also feels the
  // host's load.
  for (const DeviceInfo& info : opforge::devices()) {
    if (info.device.kind == DeviceKind::cpu) continue;
    // Devices whose memory the runtime manages: every OpenCL device, and every CUDA GPU in a
    // build with CUDA kernels.
    DeviceMemory* mem = device_memory(info.device);
    if (!mem) continue;
    auto d = std::make_unique<ExecDevice>();
    d->device = info.device;
    d->mem = mem;
    d->user_context = mem->user_context();
    d->in_auto = !info.shares_cpu_cores || auto_cpu_opencl();
    d->queue = std::make_unique<DeviceQueue>(int(devices.size()), std::vector<int>{});
    if (info.shares_cpu_cores) d->meter = std::make_unique<LoadMeter>(all_cores, nullptr);
    devices.push_back(std::move(d));
  }
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
    st.kernel_calls = d.calls.load();
    st.queue_length = s.sched.queue_length(int(i));
    st.queued_seconds = s.sched.ready_in(int(i), now);
    st.load = d.meter ? d.meter->last() : 1.0;
    // A call still running counts up to now, so that a device busy with one long call shows it.
    int64_t since = d.running_since.load(), busy = d.busy_ns.load();
    if (since) busy += std::chrono::steady_clock::now().time_since_epoch().count() - since;
    st.busy_seconds = double(busy) * 1e-9;
    if (d.mem) {
      st.device_bytes = d.mem->allocated();
      st.bytes_to_device = d.mem->bytes_copied(true);
      st.bytes_from_device = d.mem->bytes_copied(false);
    }
    if (d.pool) {
      st.tasks = d.pool->tasks();
      st.foreign_core_tasks = d.pool->foreign_tasks();
      st.busy_seconds = d.pool->busy_seconds();
    }
    out.push_back(st);
  }
  return out;
}
}  // namespace opforge
