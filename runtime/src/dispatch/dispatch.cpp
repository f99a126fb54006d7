// Running a call: on the caller's thread for the plain CPU device, on a device's queue for the
// others; faults contained and told apart (the variant's, the arguments', the copies around the
// kernel), a failed variant retried elsewhere.
#include <HalideRuntime.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/storage.hpp"
#include "dispatch/dispatch_state.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace detail {
namespace {

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

// Calls the kernel on this thread; returns the error message (empty on success). `call`: the
// call's arguments, which choose the kernel's entry point (null: a caller's own argv, run by the
// strided entry). `call_error`: the call's own Halide error slot (null: this thread's).
std::string run_kernel(State& s, const KernelGroup& g, const Decision& d, void** args,
                       KernelArgs* call, std::string* call_error, Fault& fault) {
  const VariantInfo& v = g.variants[size_t(d.variant)];
  std::string& slot = call_error ? *call_error : thread_halide_error();
  slot.clear();
  int rc = (call ? call->entry_for(*v.kernel) : v.kernel->argv)(args);
  count_kernel_run(d.device);
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
                       KernelArgs* call, std::string* call_error, const Clock& clock,
                       double& seconds, Fault& fault) {
  double t0 = d.timed ? now_seconds(clock) : 0;
  std::string err = run_kernel(s, g, d, args, call, call_error, fault);
  seconds = d.timed ? now_seconds(clock) - t0 : 0;
  return err;
}

// Runs a queued call on its device. A call first makes its tensors current where it runs (copying
// only what is stale). A GPU kernel is asynchronous: it is enqueued on the device's one in-order
// queue (OpenCL) or stream (CUDA) and the call ends without waiting for it; every later use of
// its data (a kernel there, a copy to the host or another device, synchronize()) is ordered
// behind it by that queue. A call the model times (calibration, re-timing) first waits for what
// is queued there, then for its kernel, so that its time is its own. `seconds` leaves the copies
// out: the scheduler predicts them apart (its transfer term).
std::string run_queued(State& s, const KernelGroup& g, const Decision& d, KernelArgs& args,
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
    err = run_kernel(s, g, d, argv, &args, args.error_slot(), fault);
    if (err.empty()) args.host_done();
    seconds = now_seconds(clock) - t0 - copied;
    return err;
  }
  bool ran = false;
  double drained = 0;  // waiting for earlier kernels, which is not this call's time
  try {
    args.prepare_device(*dev.mem);
    copied = now_seconds(clock) - t0;
    if (d.timed) {
      dev.mem->sync_all();
      drained = now_seconds(clock) - t0 - copied;
    }
    err = run_kernel(s, g, d, argv, &args, args.error_slot(), fault);
    if (err.empty()) {
      if (d.timed) {
        dev.mem->sync_all();
        dev.backlog_until = now_seconds(clock);
      } else {
        dev.backlog_until = std::max(dev.backlog_until.load(), now_seconds(clock)) + d.predicted;
      }
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
  seconds = now_seconds(clock) - t0 - copied - drained;
  return err;
}

// Waits for a call's dependencies; returns the failure it inherits (empty: none).
std::string wait_for(const KernelGroup& g, const std::vector<Dependency>& deps) {
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
  if (!std::isfinite(seconds) || !d.timed) return;
  count_time(g, d.variant, d.device, seconds);
}

// A kernel can fail on one device or in one schedule (a driver that cannot build it, a launch the
// GPU refuses) where others run. Its variant leaves the bucket on that device, and the next
// decision for the call, if there is one, is returned to run it again.
constexpr int kMaxFailovers = 3;
std::optional<Decision> fail_over(State& s, const KernelGroup& g, const CallExtents& ext,
                                  const std::vector<int>& devs, Clock& clock,
                                  const KernelArgs* args, const Decision& failed,
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
                            const std::vector<int>& devs, Clock& clock, KernelArgs& args,
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
      err = run_inline(s, g, d, args.argv(), &args, args.error_slot(), clock, seconds, fault);
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
  // A queued CPU call is always timed (the queue model needs its duration, and it costs nothing);
  // a GPU call only when the model asks, since timing it means waiting for the device.
  if (!dev.mem) d.timed = true;
  double now = now_seconds(clock);
  auto done =
      std::make_shared<Event>(d.device, now + s.sched.ready_in(d.device, now) + d.occupies());
  // The queued call outlives the caller's tensors: it holds their storages itself.
  args.retain();
  std::array<std::shared_ptr<Storage>, kMaxKernelBuffers> touched;
  std::array<bool, kMaxKernelBuffers> written{};
  for (int b = 0; b < nb; b++) {
    touched[size_t(b)] = args.owned(b);
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
        Backend& b = *s.devices[size_t(d.device)]->backend;
        b.call_began();
        err = run_queued(s, g, d, args, clock, seconds, fault);
        b.call_ended(true);
      }
      accounted = true;
      if (err.empty()) {
        record_time(s, g, d, seconds, true);
      } else if (fault == Fault::kernel) {
        s.sched.failed(d, true);
        const std::vector<int> devs = placed ? s.auto_devices : std::vector<int>{d.device};
        if (may_fail_over) err = retry_elsewhere(s, g, ext, devs, clock, args, d, err);
      } else {
        record_failure(s, g, d, true);
        // The copies or the device's memory failed (a GPU out of memory): a call that automatic
        // placement sent there runs on another device instead.
        std::vector<int> others;
        if (fault == Fault::around && inputs_ok && may_fail_over && placed) {
          others = s.auto_devices;
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
      s.devices[size_t(d.device)]->backend->call_ended(false);
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

void synchronize() {
  detail::State::synchronize_quietly();
  std::string err = detail::thread_errors()->take();
  if (!err.empty()) throw Error(err);
}

void dispatch(const KernelGroup& g, const CallExtents& ext, void** args) {
  detail::State& s = detail::state();
  std::vector<int> devs = {detail::pinned() ? detail::exec_index(s, default_device(), g.op->name)
                                            : 0};
  Clock clock;
  Decision d = detail::choose(s, g, ext, devs, clock);
  for (int tries = 0;; tries++) {
    if (args && args[0]) *static_cast<void**>(args[0]) = s.devices[size_t(d.device)]->user_context;
    double seconds = 0;
    detail::Fault fault = detail::Fault::none;
    std::string err = detail::run_inline(s, g, d, args, nullptr, nullptr, clock, seconds, fault);
    if (err.empty()) return detail::record_time(s, g, d, seconds, false);
    if (fault == detail::Fault::arguments) throw Error(err);
    s.sched.failed(d, false);
    auto next = tries < detail::kMaxFailovers
                    ? detail::fail_over(s, g, ext, devs, clock, nullptr, d, err)
                    : std::nullopt;
    if (!next) throw Error(err);
    d = std::move(*next);
  }
}

}  // namespace opforge
