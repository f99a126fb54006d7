// Variant selection per call from measured history, and the call into the generated kernel.
#include "opforge/dispatch.hpp"

#include <HalideRuntime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "opforge/device.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace {

// Halide reports an error on the thread that hit it, which for a parallel loop is a worker: keep
// the caller's thread's message, and the process's last one for errors raised on workers.
thread_local std::string halide_error_message;
std::mutex last_error_mu;
std::string last_error;

void halide_error_to_message(void*, const char* msg) {
  halide_error_message += msg;
  std::lock_guard<std::mutex> lock(last_error_mu);
  last_error = msg;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct VariantStats {
  std::vector<double> calibration;  // samples taken while calibrating
  double estimate = 0;              // seconds per call
  int outliers = 0;                 // consecutive re-timings far above the estimate
};

struct Entry {
  std::vector<int> eligible;  // indices into the group's variants
  std::vector<VariantStats> stats;
  int calibration_issued = 0;  // calibration runs handed out (several threads may calibrate)
  int calibration_done = 0;
  int best = 0;  // index into eligible
  uint64_t calls = 0;
  int explore_next = 0;
};

struct CallStats {
  int64_t calls = 0, timed = 0;
  double seconds = 0;
};

struct State {
  std::mutex mu;
  std::unordered_map<uint64_t, Entry> model;
  std::unordered_map<uint64_t, CallStats> calls;  // by (group, variant index)
  std::vector<const KernelGroup*> groups_seen;
  Clock clock;
  DispatchPolicy policy;
  std::string forced;
  uint64_t generation = 0;  // bumped whenever the model is cleared
  State() {
    if (const char* v = std::getenv("OPFORGE_VARIANT")) forced = v;
    halide_set_error_handler(halide_error_to_message);
  }
};

State& state() {
  static State s;
  return s;
}

int ceil_log2(int64_t x) { return x <= 1 ? 0 : 64 - __builtin_clzll(uint64_t(x - 1)); }

// Group (24 bits) | which variants accept these extents (10 bits) | log2 bucket of each extent
// (5 bits each). The acceptance mask is part of the key because a bucket spans extents on both
// sides of a variant's minimum.
uint64_t bucket_key(const KernelGroup& g, const CallExtents& ext) {
  uint64_t key = uint64_t(g.id) << 40;
  for (size_t v = 0; v < g.variants.size() && v < 10; v++)
    if (variant_accepts(g.variants[v], ext)) key |= uint64_t(1) << (30 + v);
  for (int i = 0; i < ext.n; i++) key |= uint64_t(std::min(ceil_log2(ext.e[i]), 31)) << (5 * i);
  return key;
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

Entry make_entry(const KernelGroup& g, const CallExtents& ext, const std::string& forced) {
  Entry e;
  // An exact name wins over prefix matches ("manual" must not also pick "manual_small").
  bool exact = std::any_of(g.variants.begin(), g.variants.end(),
                           [&](const VariantInfo& v) { return v.name == forced; });
  for (size_t i = 0; i < g.variants.size(); i++) {
    bool named = exact ? g.variants[i].name == forced : matches_forced(g.variants[i].name, forced);
    if (named && variant_accepts(g.variants[i], ext)) e.eligible.push_back(int(i));
  }
  if (e.eligible.empty()) {
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
  e.stats.resize(e.eligible.size());
  return e;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void update_after_timing(Entry& e, int slot, double seconds, bool calibrating,
                         const DispatchPolicy& p) {
  VariantStats& s = e.stats[slot];
  if (calibrating) {
    s.calibration.push_back(seconds);
    s.estimate = median(s.calibration);
    e.calibration_done++;
  } else if (seconds > 3 * s.estimate && s.estimate > 0) {
    // A page fault or a preempted thread must not move the estimate; a lasting change will.
    if (++s.outliers >= 3) {
      s.estimate = seconds;
      s.outliers = 0;
    }
  } else {
    s.outliers = 0;
    s.estimate = 0.75 * s.estimate + 0.25 * seconds;
  }
  int total = p.calibration_runs * int(e.eligible.size());
  if (e.calibration_done >= total) {
    int best = 0;
    for (int i = 1; i < int(e.stats.size()); i++)
      if (e.stats[i].estimate < e.stats[best].estimate) best = i;
    e.best = best;
  }
}

}  // namespace

void set_clock(Clock clock) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock = std::move(clock);
}

void force_variant(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.forced = name;
  s.model.clear();
  s.generation++;
}

std::string forced_variant() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.forced;
}

void set_dispatch_policy(const DispatchPolicy& p) {
  OPFORGE_CHECK(p.calibration_runs >= 1 && p.retime_every >= 1 && p.explore_every >= 1)
      << "set_dispatch_policy: every count must be at least 1";
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.policy = p;
  s.model.clear();
  s.generation++;
}

void reset_performance_model() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.model.clear();
  s.calls.clear();
  s.generation++;
}

std::vector<DispatchStat> dispatch_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<DispatchStat> out;
  for (const KernelGroup* g : s.groups_seen) {
    for (size_t v = 0; v < g->variants.size(); v++) {
      auto it = s.calls.find((uint64_t(g->id) << 16) | v);
      if (it == s.calls.end() || it->second.calls == 0) continue;
      const CallStats& c = it->second;
      out.push_back({g->op->name, g->dtype_key, g->variants[v].name, c.calls,
                     c.timed ? c.seconds / double(c.timed) : 0});
    }
  }
  return out;
}

bool variant_accepts(const VariantInfo& v, const CallExtents& ext) {
  for (int i = 0; i < ext.n; i++)
    if (ext.e[i] < v.kernel->min_extents[i]) return false;
  return true;
}

void dispatch(const KernelGroup& g, const CallExtents& ext, void** args) {
  State& s = state();
  int variant = 0;
  int slot = -1;  // >= 0: time this call and feed the model
  bool calibrating = false;
  uint64_t key = bucket_key(g, ext), generation;
  Clock clock;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.model.find(key);
    if (it == s.model.end()) {
      it = s.model.emplace(key, make_entry(g, ext, s.forced)).first;
      if (std::find(s.groups_seen.begin(), s.groups_seen.end(), &g) == s.groups_seen.end())
        s.groups_seen.push_back(&g);
    }
    Entry& e = it->second;
    int n = int(e.eligible.size());
    if (n == 1) {
      slot = (++e.calls % uint64_t(s.policy.retime_every)) == 0 ? 0 : -1;
    } else if (e.calibration_issued < s.policy.calibration_runs * n) {
      slot = e.calibration_issued++ % n;
      calibrating = true;
    } else {
      ++e.calls;
      if (e.calls % uint64_t(s.policy.explore_every) == 0) {
        slot = e.explore_next++ % n;
      } else if (e.calls % uint64_t(s.policy.retime_every) == 0) {
        slot = e.best;
      }
    }
    variant = e.eligible[slot >= 0 ? slot : e.best];
    s.calls[(uint64_t(g.id) << 16) | uint64_t(variant)].calls++;
    generation = s.generation;
    if (slot >= 0) clock = s.clock;
  }
  const VariantInfo& v = g.variants[variant];
  // Argument 0 is the kernel's user context: the default device's thread pool.
  if (args && args[0]) *static_cast<void**>(args[0]) = kernel_context(g.op->name);
  double t0 = 0;
  if (slot >= 0) t0 = clock ? clock() : steady_seconds();
  halide_error_message.clear();
  int rc = v.kernel->argv(args);
  if (rc != 0) {
    std::string msg = halide_error_message;
    if (msg.empty()) {
      std::lock_guard<std::mutex> lock(last_error_mu);
      msg = last_error.empty() ? "error code " + std::to_string(rc) : last_error;
    }
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    throw Error(g.op->name + " (" + g.dtype_key + ", variant " + v.name +
                "): kernel failed: " + msg);
  }
  if (slot >= 0) {
    double seconds = (clock ? clock() : steady_seconds()) - t0;
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.model.find(key);
    // A model cleared meanwhile (force_variant, reset) has other entries: drop the sample.
    if (it != s.model.end() && s.generation == generation)
      update_after_timing(it->second, slot, seconds, calibrating, s.policy);
    CallStats& c = s.calls[(uint64_t(g.id) << 16) | uint64_t(variant)];
    c.timed++;
    c.seconds += seconds;
  }
}

}  // namespace opforge
