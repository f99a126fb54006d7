// Device and variant selection per call, and running the chosen kernel: on the caller's thread
// for the plain CPU device, on a device's queue for the logical CPU devices.
#include "opforge/dispatch.hpp"

#include <HalideRuntime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/storage.hpp"
#include "devices/cpu_devices.hpp"
#include "devices/gpu_devices.hpp"
#include "dispatch/device_queue.hpp"
#include "kernels/kernel_call.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace {

// Halide reports an error with the user context of the kernel call that hit it, on whichever
// thread did (a worker, for a parallel loop): the message goes to that call's own slot
// (UserContext::error). Errors outside kernel calls (the runtime's own device copies) go to the
// reporting thread's slot.
thread_local std::string halide_error_message;

void halide_error_to_message(void* user_context, const char* msg) {
  auto* u = static_cast<detail::UserContext*>(user_context);
  if (u && u->error) {
    // Only failing calls get here; parallel workers of one call may report at once.
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (u->error->size() < 4096) *u->error += msg;
    return;
  }
  // Worker threads never clear theirs: keep the latest message only.
  if (halide_error_message.size() > 4096) halide_error_message.clear();
  halide_error_message += msg;
}

void install_halide_error_handler() {
  static const bool installed = [] {
    halide_set_error_handler(halide_error_to_message);
    return true;
  }();
  (void)installed;
}

}  // namespace

std::string detail::take_halide_error() {
  install_halide_error_handler();
  std::string m;
  m.swap(halide_error_message);
  while (!m.empty() && m.back() == '\n') m.pop_back();
  return m;
}

namespace {

// The errors of the queued calls one thread submitted, raised by that thread's synchronize(): a
// failure belongs to whoever made the call, not to the next thread that synchronizes.
struct ErrorSink {
  std::mutex mu;
  std::string first;
  void add(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (first.empty()) first = e;
  }
  std::string take() {
    std::lock_guard<std::mutex> lock(mu);
    std::string e;
    e.swap(first);
    return e;
  }
};
const std::shared_ptr<ErrorSink>& thread_errors() {
  thread_local const std::shared_ptr<ErrorSink> sink = std::make_shared<ErrorSink>();
  return sink;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A device that runs kernels: its thread pool (null: Halide's default pool), its queue (null: calls
// run on the caller's thread) and how its load is measured.
struct ExecDevice {
  Device device;
  bool in_auto = true;  // automatic placement may choose it
  detail::CpuPool* pool = nullptr;
  std::unique_ptr<detail::DeviceQueue> queue;
  std::unique_ptr<detail::LoadMeter> meter;  // null: nothing else runs there (load 1)
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> busy_ns{0};        // time spent running its queued calls
  std::atomic<int64_t> running_since{0};  // steady-clock ns when the running call began; 0: idle
  detail::DeviceMemory* mem = nullptr;    // GPU devices: their memory
  detail::UserContext cpu_context;        // logical CPU devices: routes parallel loops to the pool
  void* user_context = nullptr;           // what its kernel calls get (null: the plain cpu)
};

struct CallStats {
  int64_t calls = 0, timed = 0;
  double seconds = 0;
};

// How often each (group, variant, device) ran, counted by each dispatching thread in its own table
// (no lock another thread's calls take; dispatch_stats() sums them). Tables outlive their threads.
// Only the owner inserts, under `mu`; counters are atomics, so its calls count through a pointer
// without the lock; a reset zeroes them and never frees an entry.
struct AtomicCallStats {
  std::atomic<int64_t> calls{0}, timed{0};
  std::atomic<double> seconds{0};
};
struct ThreadStats {
  std::mutex mu;                                        // held to insert and by readers
  std::unordered_map<uint64_t, AtomicCallStats> calls;  // by stats_key
  uint64_t last_key = ~uint64_t(0);
  AtomicCallStats* last = nullptr;
  AtomicCallStats& at(uint64_t key) {
    if (key == last_key) return *last;
    std::lock_guard<std::mutex> lock(mu);
    last_key = key;
    last = &calls[key];
    return *last;
  }
};
struct AllThreadStats {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadStats>> threads;
};
AllThreadStats& all_thread_stats() {
  static auto* a = new AllThreadStats;  // never destroyed: threads may count until exit
  return *a;
}
ThreadStats& thread_stats() {
  thread_local const std::shared_ptr<ThreadStats> mine = [] {
    auto t = std::make_shared<ThreadStats>();
    AllThreadStats& all = all_thread_stats();
    std::lock_guard<std::mutex> lock(all.mu);
    all.threads.push_back(t);
    return t;
  }();
  return *mine;
}

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

// OPFORGE_AUTO_CPU_OPENCL=1: automatic placement also uses OpenCL devices that run on the host's
// cores (PoCL), which it otherwise leaves to the calls pinned there; the GPU placement paths can
// then run on a machine without a GPU.
bool auto_cpu_opencl() {
  const char* v = std::getenv("OPFORGE_AUTO_CPU_OPENCL");
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw Error("OPFORGE_AUTO_CPU_OPENCL: '" + std::string(v) + "' is not 0 or 1");
}

struct State {
  Scheduler sched;
  std::mutex mu;  // guards what follows
  Clock clock;
  std::string forced;
  std::atomic<bool> any_forced{false}, any_clock{false};  // lets calls skip the lock
  std::atomic<DevicePolicy> device_policy{initial_device_policy()};
  std::atomic<uint64_t> round_robin{0};
  bool log = log_enabled("dispatch");
  std::mutex submit_mu;  // see launch()
  std::vector<std::unique_ptr<ExecDevice>> devices;

  State() {
    if (const char* v = std::getenv("OPFORGE_VARIANT")) forced = v;
    any_forced = !forced.empty();
    install_halide_error_handler();
    const auto& pools = detail::cpu_pools();
    std::vector<int> all_cores(static_cast<size_t>(num_cpu_cores(true)));
    for (size_t i = 0; i < all_cores.size(); i++) all_cores[i] = int(i);
    if (pools.empty()) {
      auto d = std::make_unique<ExecDevice>();
      d->meter = std::make_unique<detail::LoadMeter>(all_cores, nullptr);
      devices.push_back(std::move(d));
    }
    for (size_t i = 0; i < pools.size(); i++) {
      auto d = std::make_unique<ExecDevice>();
      d->device = {DeviceKind::cpu, int(i)};
      d->pool = pools[i].get();
      d->cpu_context.pool = d->pool;
      d->user_context = &d->cpu_context;
      d->queue = std::make_unique<detail::DeviceQueue>(int(i), pools[i]->cores());
      detail::CpuPool* pool = d->pool;
      int queue_tid = d->queue->thread_id();
      d->meter = std::make_unique<detail::LoadMeter>(pool->cores(), [pool, queue_tid] {
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
      detail::DeviceMemory* mem = detail::device_memory(info.device);
      if (!mem) continue;
      auto d = std::make_unique<ExecDevice>();
      d->device = info.device;
      d->mem = mem;
      d->user_context = mem->user_context();
      d->in_auto = !info.shares_cpu_cores || auto_cpu_opencl();
      d->queue = std::make_unique<detail::DeviceQueue>(int(devices.size()), std::vector<int>{});
      if (info.shares_cpu_cores) d->meter = std::make_unique<detail::LoadMeter>(all_cores, nullptr);
      devices.push_back(std::move(d));
    }
    // Queued calls hold tensors and kernels: let them finish before the process tears down.
    std::atexit([] { synchronize_quietly(); });
    // Load is sampled here, at a fixed rate, never by a caller: a call reads the last sample.
    std::vector<detail::LoadMeter*> meters;
    for (auto& d : devices)
      if (d->meter) meters.push_back(d->meter.get());
    if (!meters.empty())
      std::thread([meters] {
        for (;;) {
          for (detail::LoadMeter* m : meters) m->sample();
          std::this_thread::sleep_for(std::chrono::milliseconds(kLoadSampleMs));
        }
      }).detach();
  }
  static constexpr int kLoadSampleMs = 50;
  static void synchronize_quietly();
};

// Never destroyed: queued work may still run while other statics are torn down.
State& state() {
  static State* s = new State;
  return *s;
}

void State::synchronize_quietly() {
  for (auto& d : state().devices)
    if (d->queue) d->queue->drain();
}

double now_seconds(const Clock& clock) { return clock ? clock() : steady_seconds(); }

int ceil_log2(int64_t x) { return x <= 1 ? 0 : 64 - __builtin_clzll(uint64_t(x - 1)); }

// Group (24 bits) | log2 bucket of each extent (5 bits each). The scheduler adds the device in
// the top 6 bits and keys its entries by the candidates' variant sets too: a bucket spans extents
// on both sides of a variant's minimum, so which variants accept the call is part of the entry.
uint64_t bucket_key(const KernelGroup& g, const CallExtents& ext) {
  uint64_t key = uint64_t(g.id & 0xFFFFFF) << 30;
  for (int i = 0; i < ext.n; i++) key |= uint64_t(std::min(ceil_log2(ext.e[i]), 31)) << (5 * i);
  return key;
}

uint64_t stats_key(const KernelGroup& g, int variant, int device) {
  return (uint64_t(g.id) << 24) | (uint64_t(variant) << 8) | uint64_t(device);
}

bool matches_forced(const std::string& name, const std::string& forced) {
  return forced.empty() || name == forced || name.rfind(forced + "_", 0) == 0;
}

std::string extents_str(const CallExtents& ext) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ext.n; i++) os << (i ? ", " : "") << ext.e[i];
  os << ")";
  return os.str();
}

// The variants whose declared minimum the call meets, as a bit mask.
uint64_t accept_mask(const KernelGroup& g, const CallExtents& ext) {
  uint64_t mask = 0;
  for (size_t i = 0; i < g.variants.size(); i++)
    if (variant_accepts(g.variants[i], ext)) mask |= uint64_t(1) << i;
  return mask;
}

// The variants that may run the call: the accepted ones the forced name selects.
uint64_t eligible_variants(const KernelGroup& g, const CallExtents& ext, uint64_t accepted,
                           const std::string& forced) {
  uint64_t mask = accepted;
  if (!forced.empty()) {
    // An exact name wins over prefix matches ("manual" must not also pick "manual_small").
    bool exact = std::any_of(g.variants.begin(), g.variants.end(),
                             [&](const VariantInfo& v) { return v.name == forced; });
    for (size_t i = 0; i < g.variants.size(); i++) {
      const std::string& name = g.variants[i].name;
      if (exact ? name != forced : !matches_forced(name, forced)) mask &= ~(uint64_t(1) << i);
    }
  }
  if (mask == 0) {
    std::ostringstream os;
    os << g.op->name << " (" << g.dtype_key << "): no variant";
    if (!forced.empty()) os << " named '" << forced << "'";
    os << " can run call extents " << extents_str(ext) << "; variants and their minimum extents:";
    for (const auto& v : g.variants) {
      os << " " << v.name << "(";
      for (int i = 0; i < ext.n; i++) os << (i ? "," : "") << v.kernel->min_extents[i];
      os << ")";
    }
    throw Error(os.str());
  }
  return mask;
}

// The index of a device in the table of devices that run kernels, or an Error.
int exec_index(const State& s, const Device& d, const std::string& op) {
  for (size_t i = 0; i < s.devices.size(); i++)
    if (s.devices[i]->device == d) return int(i);
  throw Error(op + ": " + d.str() + " runs no kernels in this build; run it on another device");
}

bool pinned() { return default_device_is_set(); }

// The devices automatic placement chooses from.
void auto_devices(const State& s, std::vector<int>& devs) {
  devs.clear();
  for (int i = 0; i < int(s.devices.size()); i++)
    if (s.devices[size_t(i)]->in_auto) devs.push_back(i);
}

// The devices a call may run on (a per-thread list, valid until the next call). Tensors that live
// on a GPU device pin the call there (device inference); tensors on two GPU devices, or on one
// other than the default device, are an error unless soft device mode moves them to the default
// device. `home`: where the output lives (the GPU device the call is pinned to, else the host).
const std::vector<int>& candidate_devices(State& s, const std::string& op,
                                          const detail::KernelArgs& args, Device& home) {
  thread_local std::vector<int> devs;
  devs.clear();
  home = {};
  int n = int(s.devices.size());
  std::optional<Device> gpu;
  std::string conflict;
  // The output counts too: writing into a GPU tensor is a call on its device.
  for (int b = 0; b < args.num_buffers(); b++) {
    const auto& st = args.storage(b);
    if (!st || !st->on_gpus()) continue;
    Device h = st->home();
    if (h.kind == DeviceKind::cpu || (gpu && h == *gpu)) continue;
    if (gpu && conflict.empty()) conflict = "tensors on " + gpu->str() + " and " + h.str();
    if (!gpu) gpu = h;
  }
  if (gpu) {
    Device target = pinned() ? default_device() : *gpu;
    if (conflict.empty() && !(target == *gpu))
      conflict = "a tensor on " + gpu->str() + " while the default device is " + target.str();
    if (!conflict.empty()) {
      if (!soft_device_mode())
        throw Error(op + ": " + conflict +
                    "; move the inputs with to_device(), or turn on soft device mode "
                    "(set_soft_device_mode(true)) to have them moved to the default device");
      target = default_device();
    }
    devs.push_back(exec_index(s, target, op));
    if (target.kind != DeviceKind::cpu) home = target;
  } else if (pinned()) {
    devs.push_back(exec_index(s, default_device(), op));
  } else if (n == 1) {
    devs.push_back(0);
  } else {
    auto_devices(s, devs);
    if (devs.size() > 1 && device_policy() == DevicePolicy::round_robin) {
      int pick = devs[s.round_robin++ % devs.size()];
      devs.assign(1, pick);
    }
  }
  return devs;
}

// Seconds to copy what the call reads to each candidate device where it is stale there, at the
// measured bandwidth of the GPU involved. Empty when nothing needs moving anywhere.
const std::vector<double>& transfer_times(const State& s, const detail::KernelArgs* args,
                                          const std::vector<Scheduler::Candidate>& cands) {
  thread_local std::vector<double> t;
  t.clear();
  if (!args || cands.size() < 2) return t;
  bool any = false;
  for (int b = 0; b < args->num_buffers() && !any; b++)
    any = args->reads(b) && args->storage(b) && args->storage(b)->on_gpus();
  for (const auto& c : cands) any = any || s.devices[size_t(c.device)]->mem;
  if (!any) return t;
  double host_bw = 0;  // a host read of GPU data goes at the slowest GPU's speed
  for (const auto& d : s.devices)
    if (d->mem) host_bw = host_bw ? std::min(host_bw, d->mem->bandwidth()) : d->mem->bandwidth();
  t.assign(s.devices.size(), 0.0);
  for (const auto& c : cands) {
    const detail::DeviceMemory* mem = s.devices[size_t(c.device)]->mem;
    size_t bytes = 0;
    for (int b = 0; b < args->num_buffers(); b++)
      if (const auto& st = args->storage(b); st && args->reads(b)) bytes += st->stale_bytes(mem);
    double bw = mem ? mem->bandwidth() : host_bw;
    if (bytes && bw > 0) t[size_t(c.device)] = double(bytes) / bw;
  }
  return t;
}

void log_decision(const State& s, const KernelGroup& g, const CallExtents& ext, const Decision& d) {
  std::ostringstream os;
  os.precision(3);
  os << "opforge dispatch: " << g.op->name << " " << g.dtype_key << " " << extents_str(ext)
     << " -> " << s.devices[size_t(d.device)]->device.str() << " "
     << g.variants[size_t(d.variant)].name;
  if (d.calibrating) os << " (calibrating)";
  for (const auto& c : d.costs)
    os << "\n    " << s.devices[size_t(c.device)]->device.str() << " "
       << g.variants[size_t(c.variant)].name << ": ready " << c.ready * 1e3 << " ms + transfer "
       << c.transfer * 1e3 << " ms + run " << c.run * 1e3 << " ms (load " << c.load
       << ") = " << c.completion * 1e3 << " ms";
  os << "\n";
  std::fputs(os.str().c_str(), stderr);
}

// Chooses (device, variant) for a call; counts the choice. deps: the events of the calls whose
// results it reads or overwrites: on another device, their predicted end delays its start.
Decision choose(State& s, const KernelGroup& g, const CallExtents& ext,
                const std::vector<int>& devs, Clock& clock,
                const std::vector<detail::Dependency>& deps = {},
                const detail::KernelArgs* args = nullptr) {
  thread_local std::vector<Scheduler::Candidate> cands;
  thread_local std::vector<double> inputs_ready;
  thread_local std::string forced;
  forced.clear();
  clock = nullptr;
  if (s.any_forced.load(std::memory_order_relaxed) || s.any_clock.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(s.mu);
    forced = s.forced;
    clock = s.clock;
  }
  uint64_t accepted = accept_mask(g, ext);
  uint64_t variants = eligible_variants(g, ext, accepted, forced);
  cands.clear();
  for (int d : devs) {
    const ExecDevice& dev = *s.devices[size_t(d)];
    uint64_t mine = variants & g.kind_mask[int(dev.device.kind)];
    if (!mine) continue;
    // Load matters where there is a choice of device. Injected time (tests) has nothing to do
    // with this machine's load.
    if (devs.size() > 1) s.sched.set_load(d, clock || !dev.meter ? 1.0 : dev.meter->last());
    cands.push_back({d, mine});
  }
  if (cands.empty()) {
    std::ostringstream os;
    os << g.op->name << " (" << g.dtype_key << "): no kernel";
    if (!forced.empty()) os << " named '" << forced << "'";
    os << " for ";
    for (size_t i = 0; i < devs.size(); i++)
      os << (i ? ", " : "") << s.devices[size_t(devs[i])]->device.str();
    os << "; its variants run on:";
    for (const auto& v : g.variants)
      os << " " << v.name << "(" << (v.kind == DeviceKind::cpu ? "cpu" : v.kernel->target) << ")";
    throw Error(os.str());
  }
  double now = cands.size() > 1 ? now_seconds(clock) : 0;  // only a choice of device needs it
  inputs_ready.clear();
  if (cands.size() > 1)
    for (const auto& dep : deps) {
      const detail::EventPtr& e = dep.event;
      if (e->done()) continue;
      inputs_ready.resize(s.devices.size());
      for (int d : devs)
        if (d != e->queue())
          inputs_ready[size_t(d)] = std::max(inputs_ready[size_t(d)], e->expected_end() - now);
    }
  Decision d = s.sched.decide(bucket_key(g, ext), cands, transfer_times(s, args, cands), now, s.log,
                              inputs_ready);
  if (s.log) log_decision(s, g, ext, d);
  thread_stats()
      .at(stats_key(g, d.variant, d.device))
      .calls.fetch_add(1, std::memory_order_relaxed);
  return d;
}

// Halide's errors that the call's arguments cause (a buffer of the wrong type, rank or layout, a
// parameter out of range): every variant would refuse them alike, so they are not the variant's.
bool caused_by_arguments(int rc) {
  switch (rc) {
    case halide_error_code_bad_type:
    case halide_error_code_bad_dimensions:
    case halide_error_code_buffer_extents_too_large:
    case halide_error_code_buffer_extents_negative:
    case halide_error_code_constraint_violated:
    case halide_error_code_param_too_small:
    case halide_error_code_param_too_large:
    case halide_error_code_buffer_argument_is_null:
    case halide_error_code_buffer_is_null:
    case halide_error_code_host_is_null:
    case halide_error_code_unaligned_host_ptr:
      return true;
    default:
      return false;
  }
}

// "op (dtype, variant v, on device)": how errors name the call.
std::string call_label(const State& s, const KernelGroup& g, const Decision& d) {
  return g.op->name + " (" + g.dtype_key + ", variant " + g.variants[size_t(d.variant)].name +
         ", on " + s.devices[size_t(d.device)]->device.str() + ")";
}

// How a call went: kernel: the variant failed (another may run it); arguments: the call's
// arguments were refused (no variant would run it); around: the copies or memory around the
// kernel failed (another device may run it).
enum class Fault { none, kernel, arguments, around };

// Calls the kernel on this thread; returns the error message (empty on success). `call_error`:
// the call's own Halide error slot (null: this thread's).
std::string run_kernel(State& s, const KernelGroup& g, const Decision& d, void** args,
                       std::string* call_error, Fault& fault) {
  const VariantInfo& v = g.variants[size_t(d.variant)];
  std::string& slot = call_error ? *call_error : halide_error_message;
  slot.clear();
  int rc = v.kernel->argv(args);
  s.devices[size_t(d.device)]->calls++;
  if (rc == 0) {
    fault = Fault::none;
    return {};
  }
  std::string msg;
  msg.swap(slot);
  if (msg.empty()) msg = "Halide error code " + std::to_string(rc);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  fault = caused_by_arguments(rc) ? Fault::arguments : Fault::kernel;
  return call_label(s, g, d) + ": " +
         (fault == Fault::arguments ? "the kernel refused the call's arguments: "
                                    : "kernel failed: ") +
         msg;
}

// Runs the call on the caller's thread, timing it when the model asked for a timing.
std::string run_inline(State& s, const KernelGroup& g, const Decision& d, void** args,
                       std::string* call_error, const Clock& clock, double& seconds, Fault& fault) {
  double t0 = d.timed ? now_seconds(clock) : 0;
  std::string err = run_kernel(s, g, d, args, call_error, fault);
  seconds = d.timed ? now_seconds(clock) - t0 : 0;
  return err;
}

// Runs a queued call on its device. A call first makes its tensors current where it runs (copying
// only what is stale); a GPU call waits for the device before it returns, so that the measured
// time is the call's. `seconds` leaves the copies out: the scheduler predicts them apart (its
// transfer term). Queued calls are always timed.
std::string run_queued(State& s, const KernelGroup& g, const Decision& d, detail::KernelArgs& args,
                       const Clock& clock, double& seconds, Fault& fault) {
  ExecDevice& dev = *s.devices[size_t(d.device)];
  void** argv = args.argv();
  double t0 = now_seconds(clock), copied = 0;
  std::string err;
  fault = Fault::around;
  if (!dev.mem) {
    try {
      args.prepare_host();
    } catch (const std::exception& e) {
      return call_label(s, g, d) + ": " + e.what();
    }
    copied = now_seconds(clock) - t0;
    err = run_kernel(s, g, d, argv, args.error_slot(), fault);
    if (err.empty()) args.host_done();
    seconds = now_seconds(clock) - t0 - copied;
    return err;
  }
  bool ran = false;
  try {
    args.prepare_device(*dev.mem);
    copied = now_seconds(clock) - t0;
    err = run_kernel(s, g, d, argv, args.error_slot(), fault);
    if (err.empty()) {
      dev.mem->sync(*args.halide_buffer(args.first_written()));
      ran = true;
    }
  } catch (const std::exception& e) {
    err = call_label(s, g, d) + ": " + e.what();
    fault = Fault::around;
  }
  try {
    args.device_done(*dev.mem, ran);
  } catch (const std::exception& e) {
    if (err.empty()) {
      err = call_label(s, g, d) + ": " + e.what();
      fault = Fault::around;
    }
  }
  seconds = now_seconds(clock) - t0 - copied;
  return err;
}

// Waits for a call's dependencies; returns the failure it inherits (empty: none).
std::string wait_for(const KernelGroup& g, const std::vector<detail::Dependency>& deps) {
  std::string err;
  for (const auto& dep : deps) {
    const std::string& e = dep.event->wait();
    if (dep.carries_error && !e.empty() && err.empty())
      err = g.op->name + ": an input was not computed: " + e;
  }
  return err;
}

// A call that failed around its kernel (a copy, GPU memory): a calibration run counts as done and
// its variant as never fastest, so that the bucket's calibration completes; queue bookkeeping ends.
void record_failure(State& s, const KernelGroup& g, Decision d, bool enqueued) {
  d.timed = d.calibrating;
  s.sched.finished(d, std::numeric_limits<double>::infinity(), enqueued);
}

void record_time(State& s, const KernelGroup& g, const Decision& d, double seconds, bool enqueued) {
  if (!d.timed && !enqueued) return;
  s.sched.finished(d, seconds, enqueued);
  if (!std::isfinite(seconds)) return;
  if (!d.timed) return;
  AtomicCallStats& c = thread_stats().at(stats_key(g, d.variant, d.device));
  c.timed.fetch_add(1, std::memory_order_relaxed);
  c.seconds.fetch_add(seconds, std::memory_order_relaxed);
}

// A kernel can fail on one device or in one schedule (a driver that cannot build it, a launch the
// GPU refuses) where others run. Its variant leaves the bucket on that device, and the next
// decision for the call, if there is one, is returned to run it again.
constexpr int kMaxFailovers = 3;
std::optional<Decision> fail_over(State& s, const KernelGroup& g, const CallExtents& ext,
                                  const std::vector<int>& devs, Clock& clock,
                                  const detail::KernelArgs* args, const Decision& failed,
                                  const std::string& err) {
  Decision next = choose(s, g, ext, devs, clock, {}, args);
  if (next.device == failed.device && next.variant == failed.variant) return std::nullopt;
  if (s.log)
    std::fprintf(stderr, "opforge dispatch: %s; trying %s %s instead\n", err.c_str(),
                 s.devices[size_t(next.device)]->device.str().c_str(),
                 g.variants[size_t(next.variant)].name.c_str());
  return next;
}

// Runs a call whose kernel failed again on this thread, wherever the scheduler places it next, a
// few times at most; returns the last error (empty: a try succeeded).
std::string retry_elsewhere(State& s, const KernelGroup& g, const CallExtents& ext,
                            const std::vector<int>& devs, Clock& clock, detail::KernelArgs& args,
                            Decision d, std::string err) {
  for (int tries = 0; tries < kMaxFailovers; tries++) {
    auto next = fail_over(s, g, ext, devs, clock, &args, d, err);
    if (!next) break;
    d = std::move(*next);
    args.set_context(s.devices[size_t(d.device)]->user_context);
    double seconds = 0;
    Fault fault = Fault::none;
    err = run_queued(s, g, d, args, clock, seconds, fault);
    if (err.empty()) {
      record_time(s, g, d, seconds, false);
      break;
    }
    if (fault == Fault::arguments) break;
    if (fault != Fault::kernel) {
      record_failure(s, g, d, false);
      break;
    }
    s.sched.failed(d, false);
  }
  return err;
}

}  // namespace

bool variant_accepts(const VariantInfo& v, const CallExtents& ext) {
  for (int i = 0; i < ext.n; i++)
    if (ext.e[i] < v.kernel->min_extents[i]) return false;
  return true;
}

void set_clock(Clock clock) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock = std::move(clock);
  s.any_clock = bool(s.clock);
}

void force_variant(const std::string& name) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.forced = name;
    s.any_forced = !name.empty();
  }
  s.sched.reset();
}

std::string forced_variant() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.forced;
}

void set_dispatch_policy(const DispatchPolicy& p) { state().sched.set_policy(p); }

void reset_performance_model() {
  State& s = state();
  s.sched.reset();
  AllThreadStats& all = all_thread_stats();
  std::lock_guard<std::mutex> lock(all.mu);
  for (const auto& t : all.threads) {
    std::lock_guard<std::mutex> tl(t->mu);
    for (auto& [key, c] : t->calls) {
      c.calls = 0;
      c.timed = 0;
      c.seconds = 0;
    }
  }
}

void set_device_policy(DevicePolicy p) { state().device_policy = p; }

DevicePolicy device_policy() { return state().device_policy; }

std::vector<DispatchStat> dispatch_stats() {
  State& s = state();
  std::map<uint64_t, CallStats> sum;  // ordered: by group, variant, device
  {
    AllThreadStats& all = all_thread_stats();
    std::lock_guard<std::mutex> lock(all.mu);
    for (const auto& t : all.threads) {
      std::lock_guard<std::mutex> tl(t->mu);
      for (const auto& [key, c] : t->calls) {
        CallStats& total = sum[key];
        total.calls += c.calls.load(std::memory_order_relaxed);
        total.timed += c.timed.load(std::memory_order_relaxed);
        total.seconds += c.seconds.load(std::memory_order_relaxed);
      }
    }
  }
  std::vector<DispatchStat> out;
  for (const auto& [key, c] : sum) {
    if (c.calls == 0) continue;
    const KernelGroup* g = kernel_group(uint32_t(key >> 24));
    size_t v = (key >> 8) & 0xFFFF, d = key & 0xFF;
    if (!g || v >= g->variants.size() || d >= s.devices.size()) continue;
    out.push_back({g->op->name, g->dtype_key, g->variants[v].name, s.devices[d]->device, c.calls,
                   c.timed ? c.seconds / double(c.timed) : 0});
  }
  return out;
}

std::vector<DeviceStats> device_stats() {
  State& s = state();
  std::vector<DeviceStats> out;
  double now = steady_seconds();
  for (size_t i = 0; i < s.devices.size(); i++) {
    const ExecDevice& d = *s.devices[i];
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

void synchronize() {
  State::synchronize_quietly();
  std::string err = thread_errors()->take();
  if (!err.empty()) throw Error(err);
}

void dispatch(const KernelGroup& g, const CallExtents& ext, void** args) {
  State& s = state();
  std::vector<int> devs = {pinned() ? exec_index(s, default_device(), g.op->name) : 0};
  Clock clock;
  Decision d = choose(s, g, ext, devs, clock);
  for (int tries = 0;; tries++) {
    if (args && args[0]) *static_cast<void**>(args[0]) = s.devices[size_t(d.device)]->user_context;
    double seconds = 0;
    Fault fault = Fault::none;
    std::string err = run_inline(s, g, d, args, nullptr, clock, seconds, fault);
    if (err.empty()) return record_time(s, g, d, seconds, false);
    if (fault == Fault::arguments) throw Error(err);
    s.sched.failed(d, false);
    auto next =
        tries < kMaxFailovers ? fail_over(s, g, ext, devs, clock, nullptr, d, err) : std::nullopt;
    if (!next) throw Error(err);
    d = std::move(*next);
  }
}

namespace detail {

void launch(const KernelGroup& g, const CallExtents& ext, KernelArgs&& args) {
  State& s = state();
  args.check(g);
  thread_local std::vector<Dependency> deps;
  deps.clear();
  const int nb = args.num_buffers();
  for (int b = 0; b < nb; b++)
    if (const auto& st = args.storage(b)) st->dependencies(deps, args.reads(b), args.writes(b));
  Clock clock;
  Device home;
  const std::vector<int>& devs = candidate_devices(s, g.op->name, args, home);
  Decision d = choose(s, g, ext, devs, clock, deps, &args);
  ExecDevice& dev = *s.devices[size_t(d.device)];
  args.set_context(dev.user_context);
  if (home.kind != DeviceKind::cpu)
    for (int b = 0; b < nb; b++)
      if (args.role(b) == BufferRole::output) args.storage(b)->adopt_home(home);

  if (!dev.queue) {
    std::string err = wait_for(g, deps);
    deps.clear();  // no event outlives the call in this thread's scratch
    double seconds = 0;
    if (err.empty()) {
      try {
        args.prepare_host();
      } catch (const std::exception& e) {
        err = g.op->name + ": " + e.what();
      }
    }
    Fault fault = Fault::none;
    if (err.empty())
      err = run_inline(s, g, d, args.argv(), args.error_slot(), clock, seconds, fault);
    if (err.empty()) {
      args.host_done();
      record_time(s, g, d, seconds, false);
    } else if (fault == Fault::kernel) {
      s.sched.failed(d, false);
      err = retry_elsewhere(s, g, ext, devs, clock, args, d, err);
    }
    if (!err.empty()) throw Error(err);
    for (int b = 0; b < nb; b++)
      if (const auto& out = args.storage(b); out && args.writes(b)) out->written_in_place();
    return;
  }

  // Asynchronous. A full queue is waited for first, holding no lock. Then taking the dependencies,
  // submitting and recording the call's event happen under one lock: a call that recorded its
  // event before being queued could otherwise be waited for by a call queued ahead of it.
  dev.queue->wait_for_space();
  std::lock_guard<std::mutex> submitting(s.submit_mu);
  deps.clear();
  for (int b = 0; b < nb; b++)
    if (const auto& st = args.storage(b)) st->dependencies(deps, args.reads(b), args.writes(b));
  d.timed = true;  // every queued call is timed: the queue model needs its duration anyway
  double now = now_seconds(clock);
  auto done =
      std::make_shared<Event>(d.device, now + s.sched.ready_in(d.device, now) + d.occupies());
  std::array<std::shared_ptr<Storage>, kMaxKernelBuffers> touched;
  std::array<bool, kMaxKernelBuffers> written{};
  for (int b = 0; b < nb; b++) {
    touched[size_t(b)] = args.storage(b);
    written[size_t(b)] = args.writes(b);
  }
  s.sched.enqueued(d);
  // Where a failed kernel may go: a forced variant stays (as the force was when the call was made);
  // automatic placement may use another device.
  bool may_fail_over = !s.any_forced.load(std::memory_order_relaxed);
  bool placed = devs.size() > 1;
  dev.queue->submit([&s, &g, d, ext, may_fail_over, placed, clock, args = std::move(args),
                     deps = std::move(deps), done, sink = thread_errors()]() mutable {
    bool accounted = false;  // the scheduler has been told how the call ended
    std::string err;
    // Nothing escapes a queued task: an exception from the retry path, an allocation or a bug is
    // the call's error, raised by whoever waits for its result; the worker goes on.
    try {
      s.sched.started(d, now_seconds(clock));
      err = wait_for(g, deps);
      double seconds = 0;
      Fault fault = Fault::none;
      bool inputs_ok = err.empty();
      if (inputs_ok) {
        auto t0 = std::chrono::steady_clock::now();
        s.devices[size_t(d.device)]->running_since = t0.time_since_epoch().count();
        err = run_queued(s, g, d, args, clock, seconds, fault);
        s.devices[size_t(d.device)]->running_since = 0;
        s.devices[size_t(d.device)]->busy_ns +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                 t0)
                .count();
      }
      accounted = true;
      if (err.empty()) {
        record_time(s, g, d, seconds, true);
      } else if (fault == Fault::kernel) {
        s.sched.failed(d, true);
        std::vector<int> devs{d.device};
        if (placed) auto_devices(s, devs);
        if (may_fail_over) err = retry_elsewhere(s, g, ext, devs, clock, args, d, err);
      } else {
        record_failure(s, g, d, true);
        // The copies or the device's memory failed (a GPU out of memory): a call that automatic
        // placement sent there runs on another device instead.
        std::vector<int> others;
        if (fault == Fault::around && inputs_ok && may_fail_over && placed) {
          auto_devices(s, others);
          others.erase(std::remove(others.begin(), others.end(), d.device), others.end());
        }
        if (!others.empty()) err = retry_elsewhere(s, g, ext, others, clock, args, d, err);
      }
    } catch (const std::exception& e) {
      err = (err.empty() ? call_label(s, g, d) + ": " : err + "; then ") + e.what();
    } catch (...) {
      err = (err.empty() ? call_label(s, g, d) + ": " : err + "; then ") + "an unknown exception";
    }
    if (!accounted) {
      s.devices[size_t(d.device)]->running_since = 0;
      try {
        record_failure(s, g, d, true);
      } catch (...) {
      }
    }
    if (!err.empty()) sink->add(err);
    done->complete(err);
  });
  // Recorded once queued (and still under the lock): a failed submit leaves no event behind.
  for (int b = 0; b < nb; b++)
    if (touched[size_t(b)]) touched[size_t(b)]->record(done, written[size_t(b)]);
}

}  // namespace detail
}  // namespace opforge
