// The placement model on synthetic performance data: times are fed in by hand and the clock is a
// number, so each test states exactly what the scheduler has measured and what it must choose.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "opforge/error.hpp"
#include "opforge/scheduler.hpp"

namespace {
using namespace opforge;

constexpr uint64_t kKey = 42;

// Two devices, each with variants 0 and 1.
std::vector<Scheduler::Candidate> two_devices() { return {{0, 0b11}, {1, 0b11}}; }

// Answers every calibration run with cost(device, variant) until the bucket is calibrated.
template <class Cost>
void calibrate(Scheduler& s, Cost cost,
               const std::vector<Scheduler::Candidate>& c = two_devices()) {
  for (;;) {
    Decision d = s.decide(kKey, c, {}, 0);
    if (!d.calibrating) return;
    s.finished(d, cost(d.device, d.variant), false);
  }
}

// Runs the calibration, answering each run with `answer`; returns the runs per (device, variant).
std::map<std::pair<int, int>, int> calibration_runs(
    Scheduler& s, const std::function<void(const Decision&)>& answer) {
  std::map<std::pair<int, int>, int> runs;
  for (;;) {
    Decision d = s.decide(kKey, two_devices(), {}, 0);
    if (!d.calibrating) return runs;
    runs[{d.device, d.variant}]++;
    answer(d);
  }
}

TEST(Scheduler, CalibratesEveryDeviceAndVariantBeforeChoosing) {
  Scheduler s;
  auto runs = calibration_runs(s, [&](const Decision& d) { s.finished(d, 1e-3, false); });
  ASSERT_EQ(runs.size(), 4u);
  for (const auto& [pair, n] : runs) EXPECT_EQ(n, DispatchPolicy{}.calibration_runs);
}

// Variant sets have no size limit: variants past 64 (a second and third word) are calibrated and
// chosen like the first ones, on a device numbered past the default count once the model is sized
// for it.
TEST(Scheduler, VariantsPast64AndManyDevices) {
  Scheduler s;
  s.set_device_count(300);
  VariantSet set;
  for (int v : {3, 70, 130}) set.insert(size_t(v));
  EXPECT_TRUE(set.contains(130) && !set.contains(129) && set.first() == 3);
  std::vector<Scheduler::Candidate> c = {{0, set}, {299, set}};
  std::map<std::pair<int, int>, int> runs;
  calibrate(
      s,
      [&](int device, int variant) {
        runs[{device, variant}]++;
        return device == 299 && variant == 130 ? 1e-3 : 5e-3;
      },
      c);
  EXPECT_EQ(runs.size(), 6u);
  for (const auto& [pair, n] : runs) EXPECT_EQ(n, DispatchPolicy{}.calibration_runs);
  Decision d = s.decide(kKey, c, {}, 0);
  EXPECT_EQ(d.device, 299);
  EXPECT_EQ(d.variant, 130);
  EXPECT_TRUE(d.variants == set);
  // The set operations keep the words beyond the first.
  VariantSet other;
  other.insert(130);
  other.insert(3);
  VariantSet both = set & other;
  std::vector<int> in;
  both.for_each([&](int v) { in.push_back(v); });
  EXPECT_EQ(in, (std::vector<int>{3, 130}));
  both.erase(130);
  EXPECT_TRUE(both == VariantSet(uint64_t(1) << 3));
  EXPECT_THROW(s.decide(kKey, {{300, set}}, {}, 0), Error);
}

// A variant measured at more than give_up_ratio times the best is timed once, not three times,
// and never explored: a slow schedule of a big convolution costs seconds a run.
TEST(Scheduler, AVariantFarSlowerThanTheBestIsNotTimedAgain) {
  Scheduler s;
  std::vector<Scheduler::Candidate> one = {{0, 0b111}};
  std::map<int, int> runs;
  for (;;) {
    Decision d = s.decide(kKey, one, {}, 0);
    if (!d.calibrating) break;
    runs[d.variant]++;
    // Variant 2 is 100 times slower than variant 0; variant 1 is 4 times (kept).
    s.finished(d, d.variant == 2 ? 0.1 : d.variant == 1 ? 4e-3 : 1e-3, false);
  }
  EXPECT_EQ(runs[0], 3);
  EXPECT_EQ(runs[1], 3);
  EXPECT_EQ(runs[2], 1);
  EXPECT_NEAR(s.estimate(kKey, 0, 2), 0.1, 1e-12);
  // Calibrated: variant 0 runs; exploration never picks variant 2 (every explore_every calls).
  int explored_slow = 0;
  for (int i = 0; i < 3 * DispatchPolicy{}.explore_every; i++) {
    Decision d = s.decide(kKey, one, {}, 0);
    EXPECT_FALSE(d.calibrating);
    explored_slow += d.variant == 2;
    s.finished(d, d.variant == 1 ? 4e-3 : 1e-3, false);
  }
  EXPECT_EQ(explored_slow, 0);
  // With the rule off (give_up_ratio as high as it goes), every variant is timed three times.
  Scheduler all;
  DispatchPolicy p;
  p.give_up_ratio = 1e300;
  all.set_policy(p);
  std::map<int, int> all_runs;
  for (;;) {
    Decision d = all.decide(kKey, one, {}, 0);
    if (!d.calibrating) break;
    all_runs[d.variant]++;
    all.finished(d, d.variant == 2 ? 0.1 : 1e-3, false);
  }
  EXPECT_EQ(all_runs[2], 3);
}

TEST(Scheduler, PicksEachDevicesFastestVariant) {
  Scheduler s;
  // Variant 1 is fast on device 0, variant 0 on device 1; device 1 is the faster overall.
  calibrate(
      s, [](int dev, int v) { return dev == 0 ? (v == 1 ? 2e-3 : 5e-3) : (v == 0 ? 1e-3 : 4e-3); });
  Decision d = s.decide(kKey, two_devices(), {}, 0, true);
  EXPECT_EQ(d.device, 1);
  EXPECT_EQ(d.variant, 0);
  ASSERT_EQ(d.costs.size(), 2u);
  EXPECT_EQ(d.costs[0].variant, 1);
  EXPECT_NEAR(d.costs[0].run, 2e-3, 1e-12);
  EXPECT_NEAR(d.costs[1].run, 1e-3, 1e-12);
}

TEST(Scheduler, PicksTheEarliestCompletionNotTheFastestDevice) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 1e-3 : 2e-3; });
  // Device 0 is twice as fast but has 5 ms of queued work: device 1 finishes first.
  for (int i = 0; i < 5; i++) {
    Decision q = s.decide(kKey, {{0, 0b11}}, {}, 0);
    s.enqueued(q);
  }
  EXPECT_EQ(s.queue_length(0), 5);
  EXPECT_NEAR(s.ready_in(0, 0), 5e-3, 1e-12);
  Decision d = s.decide(kKey, two_devices(), {}, 0);
  EXPECT_EQ(d.device, 1);
  // Once the queue has drained, the fast device wins again.
  Decision first = s.decide(kKey, {{0, 0b11}}, {}, 0);
  for (int i = 0; i < 5; i++) {
    s.started(first, 0);
    s.finished(first, 1e-3, true);
  }
  EXPECT_EQ(s.queue_length(0), 0);
  EXPECT_EQ(s.decide(kKey, two_devices(), {}, 1).device, 0);
}

TEST(Scheduler, RunningWorkCountsOnlyItsRemainingTime) {
  Scheduler s;
  calibrate(s, [](int, int) { return 4e-3; });
  Decision q = s.decide(kKey, {{0, 0b11}}, {}, 10.0);
  s.enqueued(q);
  s.started(q, 10.0);
  EXPECT_NEAR(s.ready_in(0, 10.001), 3e-3, 1e-9);
  EXPECT_NEAR(s.ready_in(0, 20.0), 0, 1e-12);  // overdue: no negative wait
}

TEST(Scheduler, CountsTheTransferOfNonResidentInputs) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 3e-3 : 1e-3; });
  // Device 1 runs faster, but its inputs would take 10 ms to arrive.
  Decision d = s.decide(kKey, two_devices(), {0.0, 10e-3}, 0, true);
  EXPECT_EQ(d.device, 0);
  EXPECT_NEAR(d.costs[1].completion, 11e-3, 1e-12);
  // A cheap transfer does not outweigh the faster device.
  EXPECT_EQ(s.decide(kKey, two_devices(), {0.0, 1e-3}, 0).device, 1);
}

TEST(Scheduler, WaitsForInputsOtherDevicesAreStillComputing) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 2e-3 : 1e-3; });
  // The input is being computed on device 0 and exists in 5 ms: on device 1 the call could not
  // start before then, while on device 0 it simply queues behind its producer.
  Decision q = s.decide(kKey, {{0, 0b11}}, {}, 0);
  q.predicted = 5e-3;
  s.enqueued(q);
  Decision d = s.decide(kKey, two_devices(), {}, 0, true, {0.0, 5e-3});
  EXPECT_NEAR(d.costs[1].ready, 5e-3, 1e-12);
  EXPECT_NEAR(d.costs[1].completion, 6e-3, 1e-12);
  EXPECT_NEAR(d.costs[0].completion, 7e-3, 1e-12);
  EXPECT_EQ(d.device, 1);
  // With a slower device 1, staying with the producer wins.
  Scheduler t;
  calibrate(t, [](int dev, int) { return dev == 0 ? 1e-3 : 3e-3; });
  EXPECT_EQ(t.decide(kKey, two_devices(), {}, 0, false, {0.0, 5e-3}).device, 0);
}

TEST(Scheduler, MovesWorkOffADeviceWhoseTimesRise) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 1e-3 : 1.5e-3; });
  Decision d = s.decide(kKey, two_devices(), {}, 0);
  ASSERT_EQ(d.device, 0);
  // Device 0 becomes four times slower; the first slow runs of each of its variants are taken for
  // outliers, a lasting change moves the estimate and the calls go to device 1.
  int to_one = 0;
  for (int i = 0; i < 20; i++) {
    Decision c = s.decide(kKey, two_devices(), {}, 0);
    c.timed = true;  // every run of a queued device is timed
    s.finished(c, c.device == 0 ? 4e-3 : 1.5e-3, false);
    to_one += c.device == 1;
  }
  EXPECT_GE(to_one, 12);
  EXPECT_EQ(s.decide(kKey, two_devices(), {}, 0).device, 1);
}

TEST(Scheduler, OneOutlierDoesNotMoveTheModel) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 1e-3 : 1.5e-3; });
  Decision c = s.decide(kKey, two_devices(), {}, 0);
  c.timed = true;
  s.finished(c, 50e-3, false);  // a page fault
  EXPECT_NEAR(s.estimate(kKey, 0, c.variant), 1e-3, 1e-12);
  EXPECT_EQ(s.decide(kKey, two_devices(), {}, 0).device, 0);
}

TEST(Scheduler, MeasuredLoadScalesPredictionsAndNormalisesMeasurements) {
  Scheduler s;
  calibrate(s, [](int, int) { return 1e-3; });
  s.set_load(0, 3.0);  // something else takes two thirds of device 0
  Decision d = s.decide(kKey, two_devices(), {}, 0, true);
  EXPECT_EQ(d.device, 1);
  EXPECT_NEAR(d.costs[0].run, 3e-3, 1e-12);
  // A run that took 3 ms under that load is the same kernel speed: the estimate stays 1 ms.
  Decision c = s.decide(kKey, {{0, 0b11}}, {}, 0);
  c.timed = true;
  s.finished(c, 3e-3, false);
  EXPECT_NEAR(s.estimate(kKey, 0, c.variant), 1e-3, 1e-12);
  s.set_load(0, 1.0);
  EXPECT_EQ(s.decide(kKey, two_devices(), {}, 0).device, 0);  // ties go to the first device
  EXPECT_THROW(s.set_load(0, 0.0), Error);
}

TEST(Scheduler, DevicesAreModelledSeparatelyPerBucket) {
  Scheduler s;
  calibrate(s, [](int dev, int) { return dev == 0 ? 1e-3 : 2e-3; });
  EXPECT_EQ(s.estimate(kKey + 1, 0, 0), 0);
  Decision d = s.decide(kKey + 1, two_devices(), {}, 0);
  EXPECT_TRUE(d.calibrating);
}

TEST(Scheduler, BadInputIsAnError) {
  Scheduler s;
  EXPECT_THROW(s.decide(kKey, {}, {}, 0), Error);
  EXPECT_THROW(s.decide(kKey, {{0, 0}}, {}, 0), Error);
  EXPECT_THROW(s.set_policy(DispatchPolicy{0, 1, 1}), Error);
}

}  // namespace

namespace {

// A device whose kernels fail leaves the bucket: calibration completes on what is left, and once
// everything has failed the first candidate is chosen again (untimed), so that its error surfaces.
TEST(Scheduler, FailedVariantsLeaveTheBucket) {
  Scheduler s;
  auto runs = calibration_runs(s, [&](const Decision& d) {
    if (d.device == 0)
      s.failed(d, false);
    else
      s.finished(d, d.variant == 0 ? 2e-3 : 1e-3, false);
  });
  EXPECT_EQ(runs[std::make_pair(0, 0)], 1);
  EXPECT_EQ(runs[std::make_pair(0, 1)], 1);
  EXPECT_EQ(runs[std::make_pair(1, 0)], DispatchPolicy{}.calibration_runs);
  EXPECT_EQ(runs[std::make_pair(1, 1)], DispatchPolicy{}.calibration_runs);
  for (int i = 0; i < 10; i++) {
    Decision d = s.decide(kKey, two_devices(), {}, 0, true);
    EXPECT_EQ(d.device, 1);
    EXPECT_EQ(d.variant, 1);
    EXPECT_EQ(d.costs.size(), 1u) << "device 0 is no longer a candidate";
  }
  for (int v : {0, 1}) {
    Decision d;
    d.device = 1;
    d.variant = v;
    d.key = kKey;
    d.variants = 0b11;  // the entry is the bucket with the candidate's variant set
    s.failed(d, false);
  }
  Decision d = s.decide(kKey, two_devices(), {}, 0);
  EXPECT_EQ(d.device, 0);
  EXPECT_EQ(d.variant, 0);
  EXPECT_FALSE(d.timed);
}

// A queued call holds its device for its copies and its run: both count in the device's queue.
TEST(Scheduler, QueuedWorkIncludesTheCopies) {
  Scheduler s;
  calibrate(s, [](int, int) { return 1e-3; });
  std::vector<double> transfer = {4e-3, 0.0};
  Decision d = s.decide(kKey, {{0, 0b11}}, transfer, 0);
  EXPECT_NEAR(d.transfer, 4e-3, 1e-12);
  s.enqueued(d);
  EXPECT_NEAR(s.ready_in(0, 0), 5e-3, 1e-12);
  s.started(d, 0);
  EXPECT_NEAR(s.ready_in(0, 1e-3), 4e-3, 1e-12);
  s.finished(d, 1e-3, true);
  EXPECT_NEAR(s.ready_in(0, 1e-3), 0, 1e-12);
}

// Work that moved off a device whose times rose comes back once a re-timing shows it fast again.
TEST(Scheduler, ADeviceFastAgainWinsItsWorkBack) {
  Scheduler s;
  DispatchPolicy p;
  p.explore_every = 16;
  p.retime_every = 1000;
  s.set_policy(p);
  calibrate(s, [](int dev, int) { return dev == 0 ? 1e-3 : 2e-3; });
  // Device 0 slows down for good (3 slow runs of a variant in a row move its estimate): work goes
  // to device 1 once both its variants were measured slow.
  int slow_runs = 0;
  for (Decision d; (d = s.decide(kKey, two_devices(), {}, 0)).device == 0 && slow_runs < 10;
       slow_runs++) {
    d.timed = true;
    s.finished(d, 1e-2, false);
  }
  EXPECT_EQ(slow_runs, 6);
  EXPECT_EQ(s.decide(kKey, two_devices(), {}, 0).device, 1);
  // Device 0 is fast again, but only a measurement can tell: within explore_every calls it gets
  // one, and then its work.
  int explored_at = -1;
  for (int i = 0; i < 20 && explored_at < 0; i++) {
    Decision d = s.decide(kKey, two_devices(), {}, 0);
    if (d.device == 0) {
      EXPECT_TRUE(d.exploring && d.timed);
      explored_at = i;
    }
    s.finished(d, d.device == 0 ? 1e-3 : 2e-3, false);
  }
  EXPECT_GE(explored_at, 0);
  EXPECT_LT(explored_at, p.explore_every);
  for (int i = 0; i < 5; i++) EXPECT_EQ(s.decide(kKey, two_devices(), {}, 0).device, 0);
}

}  // namespace
