// Per-call device and variant selection. A history-based performance model keyed by (op, dtype,
// variant, shape bucket, device): a new bucket is calibrated by timing each eligible variant a few
// times on each eligible device, then each call goes where it is expected to finish first
// (scheduler.hpp), with periodic re-timing so a changed machine is noticed. On the hot path the
// choice is a few hash lookups.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "opforge/device.hpp"
#include "opforge/registry.hpp"
#include "opforge/scheduler.hpp"

namespace opforge {

// The family's canonical extents of one call; variants declare minima in the same terms.
struct CallExtents {
  int64_t e[kMaxCallExtents] = {0, 0, 0, 0, 0, 0};
  int n = 0;
};

// Seconds on a monotonic clock. Tests inject their own.
using Clock = std::function<double()>;
void set_clock(Clock clock);  // an empty function restores the steady clock

// Forces a variant by name for every op that has it, or only for the op named `op` (the others,
// among them the copies an op makes of strided inputs, are placed as usual). A name that no
// variant of an op has exactly acts as a prefix: "adams2019" selects among "adams2019_s128" and
// "adams2019_s1024". Empty string: automatic selection. The environment variable OPFORGE_VARIANT
// sets the initial value (for every op).
void force_variant(const std::string& name, const std::string& op = {});
std::string forced_variant();

void set_dispatch_policy(const DispatchPolicy& p);
void reset_performance_model();

// Where a call runs when no default device is set on the calling thread (a set default device, or
// DefaultDevice scope, pins calls to it):
//   automatic:   the device with the earliest expected completion (queued work, transfers,
//   predicted
//                time under the device's measured load);
//   round_robin: the devices in turn, ignoring cost (a baseline for measurements).
// OPFORGE_DEVICE_POLICY=auto|round_robin sets the initial value.
enum class DevicePolicy { automatic, round_robin };
void set_device_policy(DevicePolicy p);
DevicePolicy device_policy();

// How often each (op, dtype, variant, device) was chosen.
struct DispatchStat {
  std::string op, dtype, variant;
  Device device;
  int64_t calls = 0;
  double mean_seconds = 0;  // of the timed calls
};
std::vector<DispatchStat> dispatch_stats();

// Waits until every device queue is empty, then raises, as an Error, the first error of a queued
// call this thread made since its last synchronize() (another thread's failures are its own).
// Reading a tensor waits only for the calls it depends on and raises their errors.
void synchronize();

// Runs one kernel of the group on the calling thread: chooses the variant for these extents on the
// default device and calls it with the argv-style argument array of the generated kernel (slot 0,
// when not null, receives the device's user context). Throws an Error if the kernel fails. The op
// functions use an asynchronous path that also chooses the device.
void dispatch(const KernelGroup& group, const CallExtents& extents, void** args);

// True if the variant may run a call of these extents (its declared minimum is met).
bool variant_accepts(const VariantInfo& v, const CallExtents& extents);

}  // namespace opforge
