// What the dispatcher's files share (internal): the devices that run kernels, the dispatcher's
// state, and the steps of a call that placement.cpp, call_stats.cpp, call_errors.cpp and
// dispatch.cpp each implement.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "devices/backend.hpp"
#include "devices/cpu/load_meter.hpp"
#include "devices/gpu_memory.hpp"
#include "dispatch/device_queue.hpp"
#include "kernels/kernel_call.hpp"
#include "opforge/dispatch.hpp"

namespace opforge::detail {

// A device that runs kernels, as the dispatcher keeps it: its backend (what it is, its memory, its
// user context), its queue (null: calls run on the caller's thread) and how its load is measured.
// `device`, `mem` and `user_context` are the backend's, copied here so that a call reads them
// without a virtual call.
struct ExecDevice {
  Device device;
  Backend* backend = nullptr;
  bool in_auto = true;  // automatic placement may choose it
  std::unique_ptr<DeviceQueue> queue;
  std::unique_ptr<LoadMeter> meter;  // null: nothing else runs there (load 1)
  DeviceMemory* mem = nullptr;       // devices with memory of their own (GPUs): it
  // GPU devices: when the kernels enqueued there without waiting are predicted to have run, on
  // the dispatcher's clock (a call placed there starts no earlier).
  std::atomic<double> backlog_until{0};
  void* user_context = nullptr;  // what its kernel calls get (null: the plain cpu)
};

// state.cpp: settings read from the environment at start-up.
DevicePolicy initial_device_policy();
bool log_enabled(std::string_view what);  // OPFORGE_LOG names it

struct State {
  Scheduler sched;
  std::mutex mu;  // guards what follows
  Clock clock;
  std::string forced, forced_op;  // forced_op empty: the force applies to every op
  std::atomic<bool> any_forced{false}, any_clock{false};  // lets calls skip the lock
  std::atomic<DevicePolicy> device_policy{initial_device_policy()};
  std::atomic<uint64_t> round_robin{0};
  bool log = log_enabled("dispatch");
  std::mutex submit_mu;  // see launch()
  std::vector<std::unique_ptr<ExecDevice>> devices;
  std::vector<int> auto_devices;  // those in_auto, in order: set once, with `devices`

  State();
  static constexpr int kLoadSampleMs = 50;
  static void synchronize_quietly();
};

State& state();

double steady_seconds();
inline double now_seconds(const Clock& clock) { return clock ? clock() : steady_seconds(); }

// call_errors.cpp: Halide's error text of calls outside a kernel call's own slot, per thread; the
// queued calls' errors of the thread that submitted them.
void install_halide_error_handler();
std::string& thread_halide_error();
class ErrorSink {
 public:
  void add(const std::string& e);
  std::string take();

 private:
  std::mutex mu_;
  std::string first_;
};
const std::shared_ptr<ErrorSink>& thread_errors();

// call_stats.cpp: how often each (group, variant, device) ran, and its measured time.
void count_call(const KernelGroup& g, int variant, int device);
void count_time(const KernelGroup& g, int variant, int device, double seconds);
void reset_call_stats();
// Kernel runs on each device (failed tries included), counted by each running thread in its own
// table: a shared counter would move its cache line between the cores on every call.
void count_kernel_run(int device);
int64_t kernel_runs(int device);

// placement.cpp: where a call may run, and the choice of (device, variant).
bool pinned();
int exec_index(const State& s, const Device& d, const std::string& op);
const std::vector<int>& candidate_devices(State& s, const std::string& op, const KernelArgs& args,
                                          Device& home);
// Chooses (device, variant) for a call; counts the choice. deps: the events of the calls whose
// results it reads or overwrites: on another device, their predicted end delays its start.
Decision choose(State& s, const KernelGroup& g, const CallExtents& ext,
                const std::vector<int>& devs, Clock& clock,
                const std::vector<Dependency>& deps = {}, const KernelArgs* args = nullptr);

}  // namespace opforge::detail
