// Per-call statistics: how often each (group, variant, device) ran and how long its timed runs
// took, counted by each dispatching thread in a table of its own.
#include <compare>
#include <deque>
#include <map>
#include <unordered_map>

#include "dispatch/dispatch_state.hpp"

namespace opforge {
namespace detail {
namespace {

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
// (group id, variant, device): each a full 32-bit index, so no count of variants or devices
// overflows into another field.
struct StatsKey {
  uint32_t group = ~0u, variant = ~0u, device = ~0u;
  bool operator==(const StatsKey&) const = default;
  auto operator<=>(const StatsKey&) const = default;
};
struct StatsKeyHash {
  size_t operator()(const StatsKey& k) const {
    return std::hash<uint64_t>()((uint64_t(k.group) << 32 | k.variant) * 0x9E3779B97F4A7C15ull ^
                                 k.device);
  }
};
struct ThreadStats {
  std::mutex mu;  // held to insert and by readers
  std::unordered_map<StatsKey, AtomicCallStats, StatsKeyHash> calls;
  // Kernel runs by device index; grown (under mu) on a device's first run from this thread. A
  // deque keeps its elements where they are when it grows, so a reader's sum stays valid.
  std::deque<std::atomic<int64_t>> runs;
  StatsKey last_key;
  AtomicCallStats* last = nullptr;
  AtomicCallStats& at(const StatsKey& key) {
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

StatsKey stats_key(const KernelGroup& g, int variant, int device) {
  return {g.id, uint32_t(variant), uint32_t(device)};
}

}  // namespace

void count_call(const KernelGroup& g, int variant, int device) {
  // Only this thread writes its table: a plain load and store, not a locked add. A reset racing
  // with a call may be undone by that call's count, as with any count taken while calls run.
  std::atomic<int64_t>& calls = thread_stats().at(stats_key(g, variant, device)).calls;
  calls.store(calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

void count_time(const KernelGroup& g, int variant, int device, double seconds) {
  AtomicCallStats& c = thread_stats().at(stats_key(g, variant, device));
  c.timed.fetch_add(1, std::memory_order_relaxed);
  c.seconds.fetch_add(seconds, std::memory_order_relaxed);
}

void count_kernel_run(int device) {
  ThreadStats& t = thread_stats();
  if (size_t(device) >= t.runs.size()) {
    std::lock_guard<std::mutex> lock(t.mu);
    t.runs.resize(size_t(device) + 1);
  }
  // Only this thread writes its table: a load and a store, not a locked add.
  std::atomic<int64_t>& n = t.runs[size_t(device)];
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

int64_t kernel_runs(int device) {
  AllThreadStats& all = all_thread_stats();
  std::lock_guard<std::mutex> lock(all.mu);
  int64_t sum = 0;
  for (const auto& t : all.threads) {
    std::lock_guard<std::mutex> tl(t->mu);
    if (size_t(device) < t->runs.size()) sum += t->runs[size_t(device)].load();
  }
  return sum;
}

void reset_call_stats() {
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

}  // namespace detail

std::vector<DispatchStat> dispatch_stats() {
  detail::State& s = detail::state();
  std::map<detail::StatsKey, detail::CallStats> sum;  // ordered: by group, variant, device
  {
    detail::AllThreadStats& all = detail::all_thread_stats();
    std::lock_guard<std::mutex> lock(all.mu);
    for (const auto& t : all.threads) {
      std::lock_guard<std::mutex> tl(t->mu);
      for (const auto& [key, c] : t->calls) {
        detail::CallStats& total = sum[key];
        total.calls += c.calls.load(std::memory_order_relaxed);
        total.timed += c.timed.load(std::memory_order_relaxed);
        total.seconds += c.seconds.load(std::memory_order_relaxed);
      }
    }
  }
  std::vector<DispatchStat> out;
  for (const auto& [key, c] : sum) {
    if (c.calls == 0) continue;
    const KernelGroup* g = kernel_group(key.group);
    size_t v = key.variant, d = key.device;
    if (!g || v >= g->variants.size() || d >= s.devices.size()) continue;
    out.push_back({g->op->name, g->dtype_key, g->variants[v].name, s.devices[d]->device, c.calls,
                   c.timed ? c.seconds / double(c.timed) : 0});
  }
  return out;
}
}  // namespace opforge
