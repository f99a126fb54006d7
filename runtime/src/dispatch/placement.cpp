// Placement: the devices a call may run on (device inference, pinning, soft device mode), the
// variants that may run it, and the choice between them through the scheduler's model.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "core/storage.hpp"
#include "dispatch/dispatch_state.hpp"
#include "opforge/error.hpp"

namespace opforge {
namespace detail {
namespace {

int ceil_log2(int64_t x) { return x <= 1 ? 0 : 64 - __builtin_clzll(uint64_t(x - 1)); }

// Dense (bit 54) | group (24 bits) | log2 bucket of each extent (5 bits each). The scheduler keys
// its entries by the device and by the candidates' variant sets too: a bucket
// spans extents on both sides of a variant's minimum, so which variants accept the call is part of
// the entry. Dense: a contiguous call of a group with dense companions, which run other code than
// a strided call of the same extents.
uint64_t bucket_key(const KernelGroup& g, const CallExtents& ext, const KernelArgs* args) {
  uint64_t key = uint64_t(g.id & 0xFFFFFF) << 30;
  if (g.has_dense && args && args->dense()) key |= uint64_t(1) << 54;
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

// The variants whose declared minimum the call meets.
VariantSet accept_mask(const KernelGroup& g, const CallExtents& ext) {
  bool positive = true;
  for (int d = 0; d < ext.n; d++) positive &= ext.e[d] >= 1;
  VariantSet mask = positive ? g.any_extents : VariantSet();
  for (size_t i = 0; i < g.variants.size(); i++) {
    if (mask.contains(i)) continue;
    const int64_t* min = g.variants[i].kernel->min_extents;
    int d = 0;
    while (d < ext.n && ext.e[d] >= min[d]) d++;
    if (d == ext.n) mask.insert(i);
  }
  return mask;
}

// The variants that may run the call: the accepted ones the forced name selects.
VariantSet eligible_variants(const KernelGroup& g, const CallExtents& ext, VariantSet mask,
                             const std::string& forced) {
  if (!forced.empty()) {
    // An exact name wins over prefix matches ("manual" must not also pick "manual_small").
    bool exact = std::any_of(g.variants.begin(), g.variants.end(),
                             [&](const VariantInfo& v) { return v.name == forced; });
    for (size_t i = 0; i < g.variants.size(); i++) {
      const std::string& name = g.variants[i].name;
      if (exact ? name != forced : !matches_forced(name, forced)) mask.erase(i);
    }
  }
  if (mask.empty()) {
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

// Seconds to copy what the call reads to each candidate device where it is stale there, at the
// measured bandwidth of the GPU involved. Empty when nothing needs moving anywhere.
const std::vector<double>& transfer_times(const State& s, const KernelArgs* args,
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
    const DeviceMemory* mem = s.devices[size_t(c.device)]->mem;
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

}  // namespace

// The index of a device in the table of devices that run kernels, or an Error.
int exec_index(const State& s, const Device& d, const std::string& op) {
  for (size_t i = 0; i < s.devices.size(); i++)
    if (s.devices[i]->device == d) return int(i);
  throw Error(op + ": " + d.str() + " runs no kernels in this build; run it on another device");
}

bool pinned() { return default_device_is_set(); }

namespace {
// Device inference: the device a call whose tensors have GPU copies runs on, if one of them lives
// on a GPU (the output counts too: writing into a GPU tensor is a call on its device); nullopt when
// they all live on the host. Tensors on two GPU devices, or on one other than the default device,
// are an error unless soft device mode moves them to the default device.
std::optional<Device> gpu_target(const std::string& op, const KernelArgs& args) {
  std::optional<Device> gpu;
  std::string conflict;
  for (int b = 0; b < args.num_buffers(); b++) {
    const Storage* st = args.storage(b);
    if (!st || !st->on_gpus()) continue;
    Device h = st->home();
    if (h.kind == DeviceKind::cpu || (gpu && h == *gpu)) continue;
    if (gpu && conflict.empty()) conflict = "tensors on " + gpu->str() + " and " + h.str();
    if (!gpu) gpu = h;
  }
  if (!gpu) return std::nullopt;
  Device target = pinned() ? default_device() : *gpu;
  if (conflict.empty() && !(target == *gpu))
    conflict = "a tensor on " + gpu->str() + " while the default device is " + target.str();
  if (conflict.empty()) return target;
  if (!soft_device_mode())
    throw Error(op + ": " + conflict +
                "; move the inputs with to_device(), or turn on soft device mode "
                "(set_soft_device_mode(true)) to have them moved to the default device");
  return default_device();
}
}  // namespace

// The devices a call may run on (valid until this thread's next call): the GPU device its tensors
// live on (gpu_target), else the default device of a scope, else those automatic placement chooses
// from (one of them in turn under the round-robin policy). `home`: where the output lives (the GPU
// device the call is pinned to, else the host).
const std::vector<int>& candidate_devices(State& s, const std::string& op, const KernelArgs& args,
                                          Device& home) {
  thread_local std::vector<int> one(1);
  home = {};
  bool on_gpus = false;
  for (int b = 0; b < args.num_buffers(); b++)
    if (const Storage* st = args.storage(b)) on_gpus |= st->on_gpus();
  if (on_gpus)
    if (std::optional<Device> target = gpu_target(op, args)) {
      one[0] = exec_index(s, *target, op);
      if (target->kind != DeviceKind::cpu) home = *target;
      return one;
    }
  if (pinned()) {
    one[0] = exec_index(s, default_device(), op);
    return one;
  }
  if (s.auto_devices.size() > 1 && device_policy() == DevicePolicy::round_robin) {
    one[0] = s.auto_devices[s.round_robin++ % s.auto_devices.size()];
    return one;
  }
  return s.auto_devices;  // the common case: no copy
}

namespace {
// A thread's last call with one device to choose from and nothing forced: its candidate and bucket
// key. They depend only on the group, the exact extents, the dense bit and the device, so a loop
// of calls at one shape (a training step's) finds them here instead of comparing its extents with
// every variant's minimum again. The registry's groups are never freed (it keeps its snapshots),
// so a pointer names one for good.
struct LastCall {
  const KernelGroup* group = nullptr;
  CallExtents ext;
  bool dense = false;
  std::vector<Scheduler::Candidate> cands;  // one
  uint64_t key = 0;
  bool matches(const KernelGroup& g, const CallExtents& x, bool d, const std::vector<int>& devs) {
    if (group != &g || ext.n != x.n || dense != d || devs.size() != 1 || cands[0].device != devs[0])
      return false;
    for (int i = 0; i < x.n; i++)
      if (ext.e[i] != x.e[i]) return false;
    return true;
  }
};
}  // namespace

Decision choose(State& s, const KernelGroup& g, const CallExtents& ext,
                const std::vector<int>& devs, Clock& clock, const std::vector<Dependency>& deps,
                const KernelArgs* args) {
  thread_local std::vector<Scheduler::Candidate> cands;
  thread_local std::vector<double> inputs_ready;
  thread_local std::string forced;
  thread_local LastCall last;
  forced.clear();
  clock = nullptr;
  const bool plain =
      !s.any_forced.load(std::memory_order_relaxed) && !s.any_clock.load(std::memory_order_relaxed);
  const bool dense = g.has_dense && args && args->dense();
  // Only launch()'s calls (args set) use the memo: their groups are the registry's, never freed;
  // dispatch() may be handed a caller's group, whose address a later one could reuse.
  const bool memo = plain && args;
  if (memo && last.matches(g, ext, dense, devs)) {
    static const std::vector<double> none;  // one device: no transfer or input times to weigh
    Decision d;
    s.sched.decide_into(d, last.key, last.cands, none, 0, s.log, none);
    if (s.log) log_decision(s, g, ext, d);
    count_call(g, d.variant, d.device);
    return d;
  }
  if (!plain) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.forced_op.empty() || s.forced_op == g.op->name) forced = s.forced;
    clock = s.clock;
  }
  VariantSet variants = eligible_variants(g, ext, accept_mask(g, ext), forced);
  cands.clear();
  for (int d : devs) {
    const ExecDevice& dev = *s.devices[size_t(d)];
    VariantSet mine = variants & g.kind_variants[int(dev.device.kind)];
    if (mine.empty()) continue;
    // Load matters where there is a choice of device. Injected time (tests) has nothing to do
    // with this machine's load.
    if (devs.size() > 1) s.sched.set_load(d, clock || !dev.meter ? 1.0 : dev.meter->last());
    cands.push_back({d, std::move(mine)});
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
  auto not_before = [&](int d, double seconds) {
    if (seconds <= 0) return;
    inputs_ready.resize(s.devices.size());
    inputs_ready[size_t(d)] = std::max(inputs_ready[size_t(d)], seconds);
  };
  // A GPU's kernels run on after their calls end (dispatch.cpp): what is enqueued there delays
  // a call placed there, and a call elsewhere that reads what they write.
  auto backlog = [&](int d) {
    if (d < 0 || size_t(d) >= s.devices.size()) return 0.0;
    const ExecDevice& dev = *s.devices[size_t(d)];
    return dev.mem ? dev.backlog_until.load(std::memory_order_relaxed) - now : 0.0;
  };
  if (cands.size() > 1) {
    for (const auto& dep : deps) {
      const EventPtr& e = dep.event;
      double ready = e->done() ? backlog(e->queue()) : e->expected_end() - now;
      for (int d : devs)
        if (d != e->queue()) not_before(d, ready);
    }
    for (const auto& c : cands) not_before(c.device, backlog(c.device));
  }
  const uint64_t key = bucket_key(g, ext, args);
  if (memo && devs.size() == 1 && cands.size() == 1) {
    last.group = &g;
    last.ext = ext;
    last.dense = dense;
    last.cands = cands;
    last.key = key;
  }
  Decision d;
  s.sched.decide_into(d, key, cands, transfer_times(s, args, cands), now, s.log, inputs_ready);
  if (s.log) log_decision(s, g, ext, d);
  count_call(g, d.variant, d.device);
  return d;
}

}  // namespace detail

bool variant_accepts(const VariantInfo& v, const CallExtents& ext) {
  for (int i = 0; i < ext.n; i++)
    if (ext.e[i] < v.kernel->min_extents[i]) return false;
  return true;
}

}  // namespace opforge
