// Per-call variant selection. A history-based performance model keyed by (op, dtype, variant,
// shape bucket): a new bucket is calibrated by timing each eligible variant a few times, then the
// fastest is used, with periodic re-timing so a changed machine is noticed. On the hot path the
// choice is one hash lookup.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "opforge/registry.hpp"

namespace opforge {

// The family's canonical extents of one call; variants declare minima in the same terms.
struct CallExtents {
  int64_t e[kMaxCallExtents] = {0, 0, 0, 0, 0, 0};
  int n = 0;
};

// Seconds on a monotonic clock. Tests inject their own.
using Clock = std::function<double()>;
void set_clock(Clock clock);  // an empty function restores the steady clock

// Forces a variant by name for every op that has it. A name that no variant of an op has exactly
// acts as a prefix: "adams2019" selects among "adams2019_s128" and "adams2019_s1024". Empty string:
// automatic selection. The environment variable OPFORGE_VARIANT sets the initial value.
void force_variant(const std::string& name);
std::string forced_variant();

struct DispatchPolicy {
  int calibration_runs = 3;  // timed runs of each eligible variant in a new bucket
  int retime_every = 128;    // re-time the chosen variant every N calls
  int explore_every = 2048;  // time another variant every N calls
};
void set_dispatch_policy(const DispatchPolicy& p);
void reset_performance_model();

struct DispatchStat {
  std::string op, dtype, variant;
  int64_t calls = 0;
  double mean_seconds = 0;  // of the timed calls
};
std::vector<DispatchStat> dispatch_stats();

// Runs one kernel of the group: chooses the variant for these extents and calls it with the
// argv-style argument array of the generated kernel. Throws an Error if the kernel fails.
void dispatch(const KernelGroup& group, const CallExtents& extents, void** args);

// True if the variant may run a call of these extents (its declared minimum is met).
bool variant_accepts(const VariantInfo& v, const CallExtents& extents);

}  // namespace opforge
