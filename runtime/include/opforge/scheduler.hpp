// The placement model behind every kernel call: which device and which variant run it. A history
// model per (op, dtype, shape bucket, device) holds the measured time of each variant; a call goes
// to the (device, variant) with the earliest expected completion: the device's queued work + the
// time to move inputs that are not resident there + the predicted run time scaled by the device's
// current load (StarPU's dmda). The class is pure bookkeeping: callers pass the time and the
// measurements in, so tests drive it with synthetic data.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "opforge/variant_set.hpp"

namespace opforge {

struct DispatchPolicy {
  int calibration_runs = 3;  // timed runs of each eligible variant on each device in a new bucket
  int retime_every = 128;    // re-time the chosen variant every N calls to a device
  int explore_every = 2048;  // time another variant every N calls to a device, and a device
                             // passed over N times
  // A variant measured at more than this many times its bucket's best is not timed again: its
  // remaining calibration runs count as done and it is not explored (a slow convolution schedule
  // costs seconds a run).
  double give_up_ratio = 8;
};

// What one candidate placement was expected to cost, as OPFORGE_LOG=dispatch prints it.
struct PlacementCost {
  int device = 0, variant = 0;
  double ready = 0;     // seconds until the device can start it: its queued work is done and
                        // inputs computed on other devices exist
  double load = 1;      // the device's measured load factor
  double transfer = 0;  // seconds to move non-resident inputs there
  double run = 0;       // predicted run time, load included
  double completion = 0;
};

struct Decision {
  int device = 0, variant = 0;
  bool timed = false;        // the run's time must be reported back with finished()
  bool calibrating = false;  // the run is one of a new bucket's calibration runs
  bool exploring = false;    // the run re-times a device the model has long passed over
  double predicted = 0;      // seconds, load included (0 while uncalibrated)
  double transfer = 0;       // seconds to copy its inputs there first
  // How long the call will hold its device: the copies, then the run.
  double occupies() const { return transfer + predicted; }
  uint64_t key = 0;
  VariantSet variants;  // the candidate's variant set on the chosen device (the entry's key)
  uint64_t generation = 0;
  std::vector<PlacementCost> costs;  // filled when asked to explain
};

class Scheduler {
 public:
  // A device that may run the call and the variants of the kernel group it may use.
  struct Candidate {
    int device = 0;
    VariantSet variants;
  };

  // Devices are numbered 0 to devices - 1.
  explicit Scheduler(int devices = 8);
  // Sizes the model for the devices the dispatcher discovered, before its first call.
  void set_device_count(int devices);

  void set_policy(const DispatchPolicy& p);  // clears the model
  DispatchPolicy policy() const;
  void reset();  // forgets every measurement

  // Chooses where the call in bucket `key` runs. transfer[d]: seconds to make the inputs resident
  // on device d; inputs_ready[d]: seconds until inputs that other devices are still computing
  // exist (missing entries: 0). Candidates must be non-empty, each with a variant.
  Decision decide(uint64_t key, const std::vector<Candidate>& candidates,
                  const std::vector<double>& transfer, double now, bool explain = false,
                  const std::vector<double>& inputs_ready = {}) {
    Decision d;
    decide_into(d, key, candidates, transfer, now, explain, inputs_ready);
    return d;
  }
  // The same into a default-constructed `d`: the per-call path's form, without a copy.
  void decide_into(Decision& d, uint64_t key, const std::vector<Candidate>& candidates,
                   const std::vector<double>& transfer, double now, bool explain = false,
                   const std::vector<double>& inputs_ready = {});
  // Queue bookkeeping for devices that run calls asynchronously.
  void enqueued(const Decision& d);
  void started(const Decision& d, double now);
  // seconds: the measured run time (used when d.timed). Also ends the queue entry if enqueued.
  void finished(const Decision& d, double seconds, bool was_enqueued);
  // The call's kernel failed: that variant is dropped from the bucket on that device (a device
  // none of whose variants is left gets no more of the bucket's calls, unless every candidate is
  // in that state: then the first is chosen, so that its error reaches the caller). Also ends the
  // queue entry if enqueued.
  void failed(const Decision& d, bool was_enqueued);

  // The device's slowdown from work that is not ours (1 = idle machine); measurements are divided
  // by it before they enter the model, and predictions multiplied.
  void set_load(int device, double factor);
  double load(int device) const;
  double ready_in(int device, double now) const;  // seconds of queued work predicted
  int queue_length(int device) const;
  // The model's estimate (unloaded) of a variant on a device in a bucket; 0 when unmeasured.
  double estimate(uint64_t key, int device, int variant) const;

 private:
  struct VariantStats {
    int issued = 0;   // calibration runs handed out
    int skipped = 0;  // calibration runs given up (counted as issued and done)
    std::vector<double> calibration;
    double estimate = 0;
    int outliers = 0;
  };
  struct Entry {  // one bucket on one device
    // What a call with no choice of device runs, read without the lock (-1: ask under the lock:
    // still calibrating, or no variant left): the best variant and its estimate.
    std::atomic<int> fast_variant{-1};
    std::atomic<double> fast_estimate{0};
    std::vector<int> variants;
    std::vector<VariantStats> stats;
    int calibration_issued = 0, calibration_done = 0;
    int best = 0;  // index into variants
    uint64_t calls = 0;
    int explore_next = 0;
    int passed_over = 0;  // calls of the bucket that went to another device since the last here
    bool calibrated(int runs) const { return calibration_done >= runs * int(variants.size()); }
  };
  struct DeviceState {
    double load = 1;
    double queued = 0;  // predicted seconds of enqueued calls not yet started
    int length = 0;
    bool running = false;
    double running_predicted = 0, running_start = 0;
  };
  Entry& entry(uint64_t key, int device, const VariantSet& variants);
  void publish(Entry& e);  // updates what the lock-free path reads
  bool decide_fast(uint64_t key, const Candidate& c, const std::vector<double>& transfer,
                   Decision& d);
  void record(Entry& e, int slot, double seconds, bool calibrating, bool exploring);
  // The variant is far slower than the bucket's best (give_up_ratio).
  bool given_up(const Entry& e, int slot) const;
  // Once the bucket is calibrated: its best variant, published.
  void update_best(Entry& e);
  void end_queued(const Decision& d, bool was_enqueued);
  DeviceState& dev(int d);
  const DeviceState* find_dev(int d) const;
  double ready_locked(int d, double now) const;

  mutable std::mutex mu_;
  DispatchPolicy policy_;
  std::atomic<int> retime_every_{DispatchPolicy{}.retime_every};
  std::atomic<int> explore_every_{DispatchPolicy{}.explore_every};
  // An entry is a bucket on a device with the set of variants the call may use there (a bucket
  // spans calls on both sides of a variant's minimum, so the set is part of the key).
  struct ModelKey {
    uint64_t bucket;
    VariantSet variants;
    int device;
    bool operator==(const ModelKey&) const = default;
  };
  struct ModelKeyHash {
    size_t operator()(const ModelKey& k) const {
      return std::hash<uint64_t>()(k.bucket ^ k.variants.hash() ^ (uint64_t(k.device) << 40));
    }
  };
  using Model = std::unordered_map<ModelKey, Entry, ModelKeyHash>;
  Entry* find_entry(const Decision& d);
  Model model_;
  // Models a reset replaced: the lock-free path may still hold pointers into them (it checks the
  // generation before it uses one), so their entries are never freed.
  std::vector<Model> retired_;
  const uint64_t id_;  // unique in the process (the fast slots' owner; scheduler.cpp)
  std::vector<DeviceState> devices_;
  // DeviceState::load, for the lock-free path (sized once, before the first call).
  std::vector<std::atomic<double>> loads_;
  std::atomic<uint64_t> generation_{0};
};

}  // namespace opforge
