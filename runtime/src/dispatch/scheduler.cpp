// Earliest-completion placement over (device, variant) from a per-device history model.
#include "opforge/scheduler.hpp"

#include <algorithm>

#include "opforge/error.hpp"

namespace opforge {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// A thread's memory of the entries it used last, so that a call with no choice of device finds its
// entry, and its variant, without the lock. Direct-mapped; a slot is valid for one scheduler and
// generation (a reset makes every slot stale).
struct FastSlot {
  uint64_t owner = 0;  // the scheduler's id(): unlike its address, never reused
  uint64_t generation = 0, key = 0;
  int device = -1;
  VariantSet variants;
  void* entry = nullptr;
  uint64_t calls = 0;  // this thread's calls of the entry: it re-times every retime_every
  // The next multiples of explore_every and retime_every: the per-call path compares, not divides.
  uint64_t next_explore = 0, next_retime = 0;
  void arm(uint64_t explore_every, uint64_t retime_every) {
    next_explore = (calls / explore_every + 1) * explore_every;
    next_retime = (calls / retime_every + 1) * retime_every;
  }
};
constexpr size_t kFastSlots = 64;
FastSlot& fast_slot(uint64_t key, int device, const VariantSet& variants) {
  thread_local FastSlot slots[kFastSlots];
  uint64_t h = (key ^ variants.hash() ^ (uint64_t(device) << 40)) * 0xBF58476D1CE4E5B9ull;
  return slots[(h >> 58) % kFastSlots];
}

// A scheduler made where a destroyed one lived must not match the fast slots that one left behind
// (its entries are gone): slots name their scheduler by an id no other scheduler ever gets.
static uint64_t fresh_scheduler_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Scheduler::Scheduler(int devices) : id_(fresh_scheduler_id()) { set_device_count(devices); }

void Scheduler::set_device_count(int devices) {
  OPFORGE_CHECK(devices >= 1) << "scheduler: " << devices << " devices, expected at least 1";
  std::lock_guard<std::mutex> lock(mu_);
  devices_.assign(size_t(devices), DeviceState{});
  loads_ = std::vector<std::atomic<double>>(size_t(devices));
  for (auto& l : loads_) l.store(1.0);
}

void Scheduler::set_policy(const DispatchPolicy& p) {
  OPFORGE_CHECK(p.calibration_runs >= 1 && p.retime_every >= 1 && p.explore_every >= 1 &&
                p.give_up_ratio >= 1)
      << "set_dispatch_policy: every count and give_up_ratio must be at least 1";
  std::lock_guard<std::mutex> lock(mu_);
  policy_ = p;
  retime_every_ = p.retime_every;
  explore_every_ = p.explore_every;
  retired_.push_back(std::move(model_));
  model_.clear();
  generation_++;
}

DispatchPolicy Scheduler::policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return policy_;
}

void Scheduler::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  retired_.push_back(std::move(model_));
  model_.clear();
  for (auto& d : devices_) d.load = 1;
  for (auto& l : loads_) l.store(1.0);
  generation_++;
}

Scheduler::DeviceState& Scheduler::dev(int d) {
  OPFORGE_CHECK(d >= 0 && d < int(devices_.size()))
      << "scheduler: device index " << d << " is outside 0-" << devices_.size() - 1;
  return devices_[size_t(d)];
}

const Scheduler::DeviceState* Scheduler::find_dev(int d) const {
  return d >= 0 && d < int(devices_.size()) ? &devices_[size_t(d)] : nullptr;
}

Scheduler::Entry& Scheduler::entry(uint64_t key, int device, const VariantSet& variants) {
  ModelKey k{key, variants, device};
  auto [it, created] = model_.try_emplace(k);
  Entry& e = it->second;
  if (created) {
    variants.for_each([&](int v) { e.variants.push_back(v); });
    e.stats.resize(e.variants.size());
    publish(e);
  }
  return e;
}

void Scheduler::publish(Entry& e) {
  // One variant needs no calibration when there is no choice of device either; with several, the
  // lock-free path waits for the calibration to end.
  bool known =
      !e.variants.empty() && (e.variants.size() == 1 || e.calibrated(policy_.calibration_runs));
  e.fast_estimate.store(known ? e.stats[size_t(e.best)].estimate : 0, std::memory_order_relaxed);
  e.fast_variant.store(known ? e.variants[size_t(e.best)] : -1, std::memory_order_release);
}

bool Scheduler::decide_fast(uint64_t key, const Candidate& c, const std::vector<double>& transfer,
                            Decision& d) {
  FastSlot& f = fast_slot(key, c.device, c.variants);
  uint64_t gen = generation_.load(std::memory_order_acquire);
  if (f.owner != id_ || f.generation != gen || f.key != key || f.device != c.device ||
      f.variants != c.variants)
    return false;
  const Entry& e = *static_cast<const Entry*>(f.entry);
  int v = e.fast_variant.load(std::memory_order_acquire);
  if (v < 0) return false;
  uint64_t n = ++f.calls;
  d.variants = c.variants;
  // Exploring another variant goes through the lock, as it chooses among them (and re-arms).
  if (n == f.next_explore) return false;
  d.key = key;
  d.generation = gen;
  d.device = c.device;
  d.variant = v;
  d.timed = n == f.next_retime;
  if (d.timed) f.next_retime += uint64_t(retime_every_.load(std::memory_order_relaxed));
  double load = size_t(c.device) < loads_.size()
                    ? loads_[size_t(c.device)].load(std::memory_order_relaxed)
                    : 1.0;
  d.predicted = e.fast_estimate.load(std::memory_order_relaxed) * load;
  if (size_t(c.device) < transfer.size()) d.transfer = transfer[size_t(c.device)];
  return true;
}

double Scheduler::ready_locked(int d, double now) const {
  const DeviceState* s = find_dev(d);
  if (!s) return 0;
  double r = s->queued;
  if (s->running) r += std::max(0.0, s->running_predicted - (now - s->running_start));
  return r;
}

void Scheduler::decide_into(Decision& d, uint64_t key, const std::vector<Candidate>& cands,
                            const std::vector<double>& transfer, double now, bool explain,
                            const std::vector<double>& inputs_ready) {
  OPFORGE_CHECK(!cands.empty()) << "scheduler: no candidate device";
  // A call with no choice of device on a known bucket: no lock (the common inline CPU call).
  const bool single = cands.size() == 1 && !explain;
  if (single && decide_fast(key, cands[0], transfer, d)) return;
  // The chosen device's variant set: with the bucket key, it names the entry.
  auto chosen_set = [&](Decision& r) {
    for (const auto& c : cands)
      if (c.device == r.device) r.variants = c.variants;
  };
  std::lock_guard<std::mutex> lock(mu_);
  if (single) {
    // Remembered for the lock-free path of this thread's next calls.
    FastSlot& f = fast_slot(key, cands[0].device, cands[0].variants);
    Entry& e = entry(key, cands[0].device, cands[0].variants);
    if (f.entry != &e || f.owner != id_ || f.generation != generation_) f.calls = e.calls;
    f = {id_, generation_, key, cands[0].device, cands[0].variants, &e, f.calls, 0, 0};
    f.arm(uint64_t(policy_.explore_every), uint64_t(policy_.retime_every));
  }
  d.key = key;
  d.generation = generation_;
  const int runs = policy_.calibration_runs;

  // A device with a bucket not yet calibrated gets the call, the least calibrated first: every
  // eligible (device, variant) is timed a few times before the model is trusted.
  Entry* cal = nullptr;
  int cal_device = 0;
  bool any_left = false;
  for (const auto& c : cands) {
    OPFORGE_CHECK(!c.variants.empty()) << "scheduler: device " << c.device << " has no variant";
    dev(c.device);  // an Error for a device the model was not sized for
    Entry& e = entry(key, c.device, c.variants);
    any_left = any_left || !e.variants.empty();
    if (e.variants.empty()) continue;
    bool choice = e.variants.size() > 1 || cands.size() > 1;
    if (choice && e.calibration_issued < runs * int(e.variants.size()) &&
        (!cal || e.calibration_issued < cal->calibration_issued)) {
      cal = &e;
      cal_device = c.device;
    }
  }
  if (!any_left) {
    // Every variant failed everywhere: run the first again, untimed, so that the caller sees why.
    d.device = cands[0].device;
    d.variant = cands[0].variants.first();
    chosen_set(d);
    return;
  }
  int cal_slot = -1;
  if (cal) {
    const int n = int(cal->variants.size());
    cal_slot = cal->calibration_issued++ % n;
    // A variant already measured far slower than the best is not timed again.
    while (given_up(*cal, cal_slot)) {
      cal->stats[size_t(cal_slot)].skipped++;
      cal->calibration_done++;
      cal_slot = cal->calibration_issued < runs * n ? cal->calibration_issued++ % n : -1;
      if (cal_slot < 0) break;
    }
    if (cal_slot < 0) {  // only given-up runs were left: the model decides below
      update_best(*cal);
      cal = nullptr;
    }
  }
  if (cal) {
    cal->stats[size_t(cal_slot)].issued++;
    d.device = cal_device;
    d.variant = cal->variants[size_t(cal_slot)];
    d.timed = d.calibrating = true;
    if (size_t(cal_device) < transfer.size()) d.transfer = transfer[size_t(cal_device)];
    chosen_set(d);
    return;
  }

  double best_completion = 0;
  Entry* chosen = nullptr;
  // A device passed over explore_every times is timed once more: what made it slow (load on a
  // GPU that has no load meter, another process) may have gone, and only a measurement says so.
  // Every candidate counts the call as passed over here; the one that runs it starts again at 0.
  Entry* stale = nullptr;
  PlacementCost stale_cost;
  for (const auto& c : cands) {
    Entry& e = entry(key, c.device, c.variants);
    if (e.variants.empty()) continue;
    const DeviceState& s = dev(c.device);
    PlacementCost pc;
    pc.device = c.device;
    pc.variant = e.variants[size_t(e.best)];
    auto at = [&](const std::vector<double>& v) {
      return size_t(c.device) < v.size() ? v[size_t(c.device)] : 0.0;
    };
    pc.ready = std::max(ready_locked(c.device, now), at(inputs_ready));
    pc.transfer = at(transfer);
    pc.load = s.load;
    pc.run = e.stats[size_t(e.best)].estimate * s.load;
    pc.completion = pc.ready + pc.transfer + pc.run;
    if (!chosen || pc.completion < best_completion) {
      chosen = &e;
      best_completion = pc.completion;
      d.device = c.device;
      d.predicted = pc.run;
      d.transfer = pc.transfer;
    }
    if (++e.passed_over >= policy_.explore_every && !stale) {
      stale = &e;
      stale_cost = pc;
    }
    if (explain) d.costs.push_back(pc);
  }
  if (stale && stale != chosen) {
    chosen = stale;
    d.device = stale_cost.device;
    d.predicted = stale_cost.run;
    d.transfer = stale_cost.transfer;
    d.timed = d.exploring = true;
  }
  Entry& e = *chosen;
  e.passed_over = 0;
  int n = int(e.variants.size());
  int slot = e.best;
  ++e.calls;
  if (!d.exploring && n > 1 && e.calls % uint64_t(policy_.explore_every) == 0) {
    slot = e.explore_next++ % n;  // another variant on this device, timed
    for (int tries = 1; tries < n && given_up(e, slot); tries++) slot = e.explore_next++ % n;
    if (given_up(e, slot)) slot = e.best;
    d.timed = true;
  } else if (e.calls % uint64_t(policy_.retime_every) == 0) {
    d.timed = true;
  }
  d.variant = e.variants[size_t(slot)];
  if (slot != e.best) d.predicted = e.stats[size_t(slot)].estimate * dev(d.device).load;
  chosen_set(d);
}

void Scheduler::record(Entry& e, int slot, double seconds, bool calibrating, bool exploring) {
  VariantStats& s = e.stats[size_t(slot)];
  if (calibrating) {
    s.calibration.push_back(seconds);
    s.estimate = median(s.calibration);
    e.calibration_done++;
  } else if (exploring && seconds < s.estimate) {
    // A device that became faster again gets its work back now, not after many calls it would
    // not be given on the old estimate.
    s.estimate = seconds;
    s.outliers = 0;
  } else if (s.estimate > 0 && seconds > 3 * s.estimate) {
    // A page fault or a preempted thread must not move the estimate; a lasting change will.
    if (++s.outliers >= 3) {
      s.estimate = seconds;
      s.outliers = 0;
    }
  } else {
    s.outliers = 0;
    s.estimate = s.estimate > 0 ? 0.75 * s.estimate + 0.25 * seconds : seconds;
  }
  update_best(e);
}

void Scheduler::update_best(Entry& e) {
  if (e.variants.size() == 1 || e.calibrated(policy_.calibration_runs)) {
    int best = 0;
    for (int i = 1; i < int(e.stats.size()); i++)
      if (e.stats[size_t(i)].estimate < e.stats[size_t(best)].estimate) best = i;
    e.best = best;
  }
  publish(e);
}

bool Scheduler::given_up(const Entry& e, int slot) const {
  const VariantStats& v = e.stats[size_t(slot)];
  if (v.calibration.empty()) return false;
  double best = v.estimate;
  for (const VariantStats& o : e.stats)
    if (!o.calibration.empty()) best = std::min(best, o.estimate);
  return v.estimate > policy_.give_up_ratio * best;
}

void Scheduler::enqueued(const Decision& d) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState& s = dev(d.device);
  s.queued += d.occupies();
  s.length++;
}

void Scheduler::started(const Decision& d, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState& s = dev(d.device);
  s.queued = std::max(0.0, s.queued - d.occupies());
  s.running = true;
  s.running_predicted = d.occupies();
  s.running_start = now;
}

void Scheduler::end_queued(const Decision& d, bool was_enqueued) {
  DeviceState& s = dev(d.device);
  if (was_enqueued) {
    s.length--;
    s.running = false;
    if (s.length == 0) s.queued = 0;  // rounding must not leave phantom work behind
  }
}

Scheduler::Entry* Scheduler::find_entry(const Decision& d) {
  auto it = model_.find({d.key, d.variants, d.device});
  return it == model_.end() ? nullptr : &it->second;
}

void Scheduler::failed(const Decision& d, bool was_enqueued) {
  std::lock_guard<std::mutex> lock(mu_);
  end_queued(d, was_enqueued);
  if (d.generation != generation_) return;
  Entry* found = find_entry(d);
  if (!found) return;
  Entry& e = *found;
  auto pos = std::find(e.variants.begin(), e.variants.end(), d.variant);
  if (pos == e.variants.end()) return;
  size_t slot = size_t(pos - e.variants.begin());
  // Its calibration runs no longer count towards the bucket's.
  e.calibration_issued -= e.stats[slot].issued + e.stats[slot].skipped;
  e.calibration_done -= int(e.stats[slot].calibration.size()) + e.stats[slot].skipped;
  e.variants.erase(pos);
  e.stats.erase(e.stats.begin() + std::ptrdiff_t(slot));
  e.best = 0;
  e.explore_next = 0;
  if (e.variants.size() > 1 && e.calibrated(policy_.calibration_runs))
    for (int i = 1; i < int(e.stats.size()); i++)
      if (e.stats[size_t(i)].estimate < e.stats[size_t(e.best)].estimate) e.best = i;
  publish(e);
}

void Scheduler::finished(const Decision& d, double seconds, bool was_enqueued) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState& s = dev(d.device);
  end_queued(d, was_enqueued);
  if (!d.timed || d.generation != generation_) return;
  Entry* found = find_entry(d);
  if (!found) return;
  Entry& e = *found;
  auto pos = std::find(e.variants.begin(), e.variants.end(), d.variant);
  if (pos == e.variants.end()) return;
  record(e, int(pos - e.variants.begin()), seconds / s.load, d.calibrating, d.exploring);
}

void Scheduler::set_load(int device, double factor) {
  OPFORGE_CHECK(factor > 0) << "scheduler: load factor must be positive, got " << factor;
  // Every call with a choice of device passes the latest sample, which changes only when the
  // load meter samples again: an unchanged one takes no lock and writes no shared line.
  if (size_t(device) < loads_.size() &&
      loads_[size_t(device)].load(std::memory_order_relaxed) == factor)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  dev(device).load = factor;
  loads_[size_t(device)].store(factor, std::memory_order_relaxed);
}

double Scheduler::load(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceState* s = find_dev(device);
  return s ? s->load : 1;
}

double Scheduler::ready_in(int device, double now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_locked(device, now);
}

int Scheduler::queue_length(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceState* s = find_dev(device);
  return s ? s->length : 0;
}

double Scheduler::estimate(uint64_t key, int device, int variant) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Whichever variant set the bucket was entered with on that device.
  for (const auto& [k, e] : model_) {
    if (k.bucket != key || k.device != device) continue;
    for (size_t i = 0; i < e.variants.size(); i++)
      if (e.variants[i] == variant) return e.stats[i].estimate;
  }
  return 0;
}

}  // namespace opforge
