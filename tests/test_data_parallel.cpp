// Data-parallel training in one process: the throughput-proportional batch split, and
// nn::DataParallel's gradients against one backward pass over the whole batch (float64). With
// OPFORGE_CPU_DEVICES="0;1" (ctest's ops_on_two_logical_devices run) the shares run on two logical
// CPU devices at once; in the plain run on the one CPU device, and on cpu with PoCL's device.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "opforge/adaptive_batch.hpp"
#include "opforge/batch_split.hpp"
#include "opforge/opforge.hpp"
#include "opforge/torch/nn.hpp"
#include "opforge/torch/optim.hpp"
#include "opforge/torch/parallel.hpp"
#include "small_mlp.hpp"

namespace {
using namespace opforge;
using namespace opforge::torch;

int64_t total(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

TEST(ThroughputSplit, SharesFollowTheRates) {
  ThroughputSplit s({3.0, 1.0});
  EXPECT_EQ(s.split(128), (std::vector<int64_t>{96, 32}));
  ThroughputSplit three({1.0, 1.0, 1.0});
  std::vector<int64_t> t = three.split(100);
  EXPECT_EQ(total(t), 100);
  for (int64_t k : t) EXPECT_TRUE(k == 33 || k == 34) << k;
  // Every device keeps at least one sample to be measured by, however slow it is.
  ThroughputSplit skewed({1000.0, 1.0});
  EXPECT_EQ(skewed.split(10), (std::vector<int64_t>{9, 1}));
  // Fewer samples than devices: the fastest get one each.
  ThroughputSplit few({1.0, 5.0, 3.0});
  EXPECT_EQ(few.split(2), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(few.split(0), (std::vector<int64_t>{0, 0, 0}));
}

TEST(ThroughputSplit, ConvergesWithoutOscillatingAndFollowsALoadChange) {
  // Two devices that truly run 1200 and 400 samples/s (measured with +-10% noise), started as
  // equals: the split settles near 3:1 and stays there, then follows device 1 becoming twice as
  // fast within a few steps.
  ThroughputSplit s({1.0, 1.0});
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  double truth[2] = {1200, 400};
  std::vector<int64_t> split;
  int changes = 0;
  auto step = [&] {
    std::vector<int64_t> next = s.split(256);
    EXPECT_EQ(total(next), 256);
    changes += !split.empty() && next != split;
    split = next;
    s.record(split,
             {double(split[0]) / truth[0] * noise(rng), double(split[1]) / truth[1] * noise(rng)});
  };
  for (int i = 0; i < 10; i++) step();
  EXPECT_NEAR(double(split[0]) / 256, 0.75, 0.05) << split[0] << " " << split[1];
  changes = 0;
  for (int i = 0; i < 40; i++) step();
  EXPECT_NEAR(double(split[0]) / 256, 0.75, 0.05);
  EXPECT_LE(changes, 10) << "the split changed in " << changes << " of 40 steps of noise alone";
  truth[1] = 1200;
  for (int i = 0; i < 5; i++) step();
  EXPECT_NEAR(double(split[0]) / 256, 0.5, 0.08) << split[0] << " " << split[1];
}

TEST(ThroughputSplit, ADeviceLeavesAndTheOthersKeepTheirRates) {
  ThroughputSplit s({3.0, 1.0, 1.0});
  s.record(s.split(100), {0.2, 0.2, 0.2});  // 300, 100 and 100 samples/s
  s.drop(1);
  EXPECT_EQ(s.devices(), 2u);
  EXPECT_EQ(s.split(100), (std::vector<int64_t>{75, 25}));
  s.drop(0);
  EXPECT_THROW(s.drop(0), Error);  // the last device stays
  EXPECT_EQ(s.split(7), (std::vector<int64_t>{7}));
}

TEST(ThroughputSplit, RefusesBadInput) {
  EXPECT_THROW(ThroughputSplit({}), Error);
  EXPECT_THROW(ThroughputSplit({1.0, 0.0}), Error);
  EXPECT_THROW(ThroughputSplit({1.0, NAN}), Error);
  ThroughputSplit s({1.0, 1.0});
  EXPECT_THROW(s.split(-1), Error);
  EXPECT_THROW(s.record({1}, {1.0, 1.0}), Error);
  // A time that is not a positive finite number leaves the estimate as it was.
  s.record({10, 10}, {0.0, NAN});
  EXPECT_EQ(s.rates(), (std::vector<double>{1.0, 1.0}));
}

// A device whose samples per second saturate with the batch: 10 000 b / (b + 16), times `slow`.
struct Saturating {
  double slow = 1;
  double seconds(int64_t b) const { return double(b + 16) / 10000.0 * slow; }
};

// Bounds, and measurements by step counts only (the synthetic steps take milliseconds).
AdaptiveBatchSize::Options by_steps(int64_t min, int64_t max) {
  AdaptiveBatchSize::Options o;
  o.min = min;
  o.max = max;
  o.warmup = 1;
  o.window_seconds = 0;
  return o;
}

TEST(AdaptiveBatchSize, GrowsWhileThroughputRisesThenSettles) {
  AdaptiveBatchSize::Options o = by_steps(16, 1024);
  o.settle = 100;
  AdaptiveBatchSize a(32, o);
  Saturating device;
  std::vector<std::pair<int64_t, int64_t>> changes;
  for (int step = 0; step < 80; step++) {
    const int64_t b = a.batch();
    if (auto c = a.record(b, device.seconds(b), false)) {
      EXPECT_EQ(c->from, b);
      changes.emplace_back(c->from, c->to);
    }
  }
  // 32 -> 64 (+20% samples/s) -> 128 (+11%) -> 256 (+6%) -> 512 (+3%, too little) -> 256.
  EXPECT_EQ(changes, (std::vector<std::pair<int64_t, int64_t>>{
                         {32, 64}, {64, 128}, {128, 256}, {256, 512}, {512, 256}}));
  EXPECT_EQ(a.batch(), 256);
  // Settled: no try of a larger batch before `settle` steps; a try after them.
  int64_t tried_at = 0;
  for (int step = 0; step < 100 && tried_at == 0; step++)
    if (a.record(256, device.seconds(256), false)) tried_at = step + 1;
  EXPECT_GE(tried_at, 60) << "a larger batch tried " << tried_at << " steps after settling";
  EXPECT_EQ(a.batch(), 512);
}

TEST(AdaptiveBatchSize, ShrinksUnderLoadAndWhenMemoryRunsShort) {
  AdaptiveBatchSize::Options o = by_steps(16, 256);
  AdaptiveBatchSize a(256, o);
  Saturating device;
  for (int step = 0; step < 20; step++) EXPECT_FALSE(a.record(256, device.seconds(256), false));
  // Another process takes half the device: within two windows (one slow one may be noise) the
  // batch halves, saying why.
  device.slow = 2;
  std::optional<AdaptiveBatchSize::Change> c;
  int steps = 0;
  while (!c && steps < 20) c = a.record(256, device.seconds(256), false), steps++;
  ASSERT_TRUE(c);
  EXPECT_LE(steps, 17);
  EXPECT_EQ(c->to, 128);
  EXPECT_NE(c->why.find("under load"), std::string::npos) << c->why;
  // Memory short (heeded after the warm-up step and a window at the batch): halved at once, and
  // no growth past it.
  for (int step = 0; step < 9; step++) EXPECT_FALSE(a.record(128, device.seconds(128), true));
  c = a.record(128, device.seconds(128), true);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->to, 64);
  EXPECT_NE(c->why.find("memory"), std::string::npos) << c->why;
  for (int step = 0; step < 90; step++) {
    auto more = a.record(a.batch(), device.seconds(a.batch()), false);
    EXPECT_FALSE(more.has_value()) << "changed to " << more->to << " at step " << step;
  }
  // Never below the bound.
  AdaptiveBatchSize low(16, o);
  for (int step = 0; step < 30; step++) EXPECT_FALSE(low.record(16, 1.0, true));
  EXPECT_EQ(low.batch(), 16);
  EXPECT_THROW(AdaptiveBatchSize(8, o), Error);
  // Over ranks: every batch a multiple of their number, the bounds rounded inward (18..99).
  AdaptiveBatchSize::Options three = by_steps(16, 100);
  three.multiple = 3;
  EXPECT_THROW(AdaptiveBatchSize(64, three), Error);
  AdaptiveBatchSize grows(63, three), shrinks(63, three);
  std::optional<AdaptiveBatchSize::Change> up, down;
  for (int step = 0; step < 10; step++) {
    up = grows.record(63, 0.01, false);
    down = shrinks.record(63, 0.01, true);
    if (up) {
      EXPECT_EQ(up->to, 99);  // 126 above the bound
    }
  }
  ASSERT_TRUE(down);
  EXPECT_EQ(down->to, 30);  // 31 is no multiple of 3
  EXPECT_EQ(grows.batch(), 99);
  o.min = 300;
  EXPECT_THROW(AdaptiveBatchSize(300, o), Error);
}

// The devices to split over: both logical CPU devices where they are configured, else the CPU.
std::vector<Device> cpu_devices() {
  std::vector<Device> out;
  for (const DeviceInfo& d : devices())
    if (d.device.kind == DeviceKind::cpu) out.push_back(d.device);
  return out;
}

struct Batch {
  Tensor x, y;
};
Batch batch(int64_t n, uint64_t seed, int64_t features = 12) {
  Generator g(seed);
  Tensor x = sub(mul(Tensor::rand({n, features}, DType::Float64, g), 4.0), 2.0);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) labels[size_t(i)] = (i * 7 + int64_t(seed)) % 5;
  return {x, Tensor::from_vector(labels)};
}

void expect_same_gradients(const std::vector<Device>& devs) {
  auto net = small_mlp(3);
  nn::CrossEntropyLoss criterion;
  Batch b = batch(37, 5);
  Tensor loss = criterion((*net)(b.x), b.y);
  loss.backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& p : net->parameters()) want.push_back(p.grad().to_vector<double>());
  net->zero_grad();

  nn::DataParallel dp(net, devs);
  Tensor dp_loss = dp.forward_backward(b.x, b.y, criterion);
  EXPECT_EQ(total(dp.last_split()), 37);
  for (size_t i = 0; i < devs.size(); i++)
    EXPECT_GT(dp.last_split()[i], 0) << devs[i].str() << " ran none of the batch";
  EXPECT_NEAR(dp_loss.item(), loss.item(), 1e-12);
  std::vector<Tensor> params = net->parameters();
  for (size_t j = 0; j < params.size(); j++) {
    std::vector<double> got = params[j].grad().to_vector<double>();
    ASSERT_EQ(got.size(), want[j].size());
    for (size_t k = 0; k < got.size(); k++)
      ASSERT_NEAR(got[k], want[j][k], 1e-12 + 1e-10 * std::abs(want[j][k]))
          << "parameter " << j << " element " << k;
  }
  // A second step adds into grad(), as backward() does.
  dp.forward_backward(b.x, b.y, criterion);
  std::vector<double> twice = params[0].grad().to_vector<double>();
  for (size_t k = 0; k < twice.size(); k++)
    ASSERT_NEAR(twice[k], 2 * want[0][k], 1e-12 + 1e-10 * std::abs(want[0][k]));
}

TEST(DataParallel, GradientsEqualOneBackwardOverTheWholeBatch) {
  expect_same_gradients(cpu_devices());
}

TEST(DataParallel, GradientsEqualOneBackwardWithAnOpenClDevice) {
  if (!device_exists(Device{DeviceKind::opencl, 0})) GTEST_SKIP() << "no OpenCL device";
  std::vector<Device> devs = {cpu_devices()[0], Device{DeviceKind::opencl, 0}};
  expect_same_gradients(devs);
}

TEST(DataParallel, TrainingMatchesOneDevice) {
  // Ten SGD steps with momentum over the devices give the parameters of ten steps on the whole
  // batch (float64: to rounding).
  auto single = small_mlp(9), parallel = small_mlp(9);
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9};
  optim::SGD opt1(single->parameters(), o), opt2(parallel->parameters(), o);
  nn::CrossEntropyLoss criterion;
  nn::DataParallel dp(parallel, cpu_devices());
  for (int step = 0; step < 10; step++) {
    Batch b = batch(64, uint64_t(step));
    opt1.zero_grad();
    criterion((*single)(b.x), b.y).backward();
    opt1.step();
    opt2.zero_grad();
    dp.forward_backward(b.x, b.y, criterion);
    opt2.step();
  }
  std::vector<Tensor> a = single->parameters(), p = parallel->parameters();
  for (size_t j = 0; j < a.size(); j++) {
    std::vector<double> want = a[j].to_vector<double>(), got = p[j].to_vector<double>();
    for (size_t k = 0; k < want.size(); k++)
      ASSERT_NEAR(got[k], want[k], 1e-10 + 1e-9 * std::abs(want[k])) << j << " " << k;
  }
}

// Caps a CPU device's memory for the scope, then lifts it (the cap is process-wide).
class MemoryCap {
 public:
  MemoryCap(const Device& d, uint64_t bytes) : d_(d) { set(bytes); }
  ~MemoryCap() { set_memory_fraction(d_, 1.0); }
  void set(uint64_t bytes) {
    set_memory_fraction(d_, double(bytes) / double(total_mem_on_dev(d_)));
  }

 private:
  Device d_;
};

TEST(DataParallel, MicroBatchesWhereADeviceRunsOutOfMemory) {
  std::vector<Device> devs = cpu_devices();
  if (devs.size() < 2) GTEST_SKIP() << "needs two logical CPU devices (OPFORGE_CPU_DEVICES)";
  // A wide hidden layer: 32 KiB a sample for each activation and its gradient, against about
  // 1 MiB for the parameters' gradients (held three times while micro-batches add up).
  Generator g(12);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 4096, true, DType::Float64, g), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(4096, 5, true, DType::Float64, g)});
  nn::CrossEntropyLoss criterion;
  Batch b = batch(96, 3, 4);
  criterion((*net)(b.x), b.y).backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& p : net->parameters()) want.push_back(p.grad().to_vector<double>());

  nn::DataParallel dp(net, devs);
  MemoryCap cap(devs[1], uint64_t(3) << 20);  // the whole share (48 samples) needs about 6 MiB
  net->zero_grad();
  dp.forward_backward(b.x, b.y, criterion);
  const int64_t micro = dp.micro_batch_sizes()[1];
  EXPECT_GT(micro, 0) << "cpu:1 ran its share at once within the cap";
  EXPECT_LT(micro, dp.last_split()[1]);
  EXPECT_EQ(dp.micro_batch_sizes()[0], 0);
  std::vector<Tensor> params = net->parameters();
  for (size_t j = 0; j < params.size(); j++) {
    std::vector<double> got = params[j].grad().to_vector<double>();
    for (size_t k = 0; k < got.size(); k++)
      ASSERT_NEAR(got[k], want[j][k], 1e-12 + 1e-10 * std::abs(want[j][k]))
          << "micro-batches of " << micro << ": parameter " << j << " element " << k;
  }
  // With headroom again the micro-batch grows back to the whole share.
  set_memory_fraction(devs[1], 1.0);
  for (int step = 0; step < 60 && dp.micro_batch_sizes()[1] != 0; step++) {
    net->zero_grad();
    dp.forward_backward(b.x, b.y, criterion);
  }
  EXPECT_EQ(dp.micro_batch_sizes()[1], 0) << "still micro-batches of " << dp.micro_batch_sizes()[1];
  // Not even one sample fits: alone, the device's share is an out-of-memory error naming it;
  // beside another device, it leaves the split and the other runs its share.
  cap.set(1024);
  nn::DataParallel alone(net, {devs[1]});
  try {
    alone.forward_backward(b.x, b.y, criterion);
    ADD_FAILURE() << "no error within a 1 KiB cap";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find(devs[1].str()), std::string::npos) << e.what();
  }
  dp.forward_backward(b.x, b.y, criterion);
  ASSERT_EQ(dp.dropped().size(), 1u);
  EXPECT_EQ(dp.dropped()[0].first, devs[1]);
  EXPECT_NE(dp.dropped()[0].second.find("out of memory"), std::string::npos);
  EXPECT_EQ(dp.last_split()[0], 96);
}

TEST(DataParallel, ForwardConcatenatesTheShares) {
  auto net = small_mlp(4);
  Batch b = batch(21, 2);
  nn::DataParallel dp(net, cpu_devices());
  autograd::NoGradGuard no_grad;
  std::vector<double> want = (*net)(b.x).to_vector<double>(),
                      got = dp.forward(b.x).to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); k++) ASSERT_NEAR(got[k], want[k], 1e-12);
}

TEST(DataParallel, RefusesWhatItCannotSplit) {
  auto net = small_mlp(1);
  EXPECT_THROW(nn::DataParallel(net, {}), Error);
  EXPECT_THROW(nn::DataParallel(nullptr, cpu_devices()), Error);
  EXPECT_THROW(nn::DataParallel(net, {cpu_devices()[0], cpu_devices()[0]}), Error);
  nn::DataParallel dp(net, cpu_devices());
  nn::CrossEntropyLoss criterion;
  Batch b = batch(8, 1);
  EXPECT_THROW(dp.forward_backward(b.x, b.y.slice(0, 0, 7), criterion), Error);
  // A layer of the user's with a buffer of its own, in training mode, which the shares' threads
  // would change at once.
  struct Counting : nn::Module {
    Counting() { calls = register_buffer("calls", Tensor::zeros({}, DType::Int64)); }
    Tensor forward(const Tensor& x) override {
      calls.add_(1.0);
      return x;
    }
    std::string name() const override { return "Counting"; }
    Tensor calls;
  };
  auto with_state =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(12, 5, true, DType::Float64), std::make_shared<Counting>()});
  nn::DataParallel stateful_dp(with_state, cpu_devices());
  try {
    stateful_dp.forward_backward(b.x, b.y, criterion);
    ADD_FAILURE() << "a training-mode layer with a buffer was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Counting"), std::string::npos) << e.what();
  }
  with_state->eval();
  EXPECT_EQ(stateful_dp.forward(b.x).size(0), 8);
  // An error that is not the device's (it happens wherever the share runs) names the device
  // that met it first, no gradient is added, and every device stays.
  auto failing = [&](const Tensor&, const Tensor&) -> Tensor { throw Error("no loss here"); };
  const size_t devices_before = dp.devices().size();
  net->zero_grad();
  try {
    dp.forward_backward(b.x, b.y, failing);
    ADD_FAILURE() << "the share's error was not raised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dp.devices()[0].str()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no loss here"), std::string::npos) << e.what();
  }
  for (const Tensor& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(dp.devices().size(), devices_before);
  EXPECT_TRUE(dp.dropped().empty());
}

TEST(DataParallel, ADeviceThatFailsLeavesTheSplitAndTheStepGoesOn) {
  std::vector<Device> devs = cpu_devices();
  if (device_exists(Device{DeviceKind::opencl, 0})) devs.push_back(Device{DeviceKind::opencl, 0});
  if (devs.size() < 2) GTEST_SKIP() << "needs two devices";
  const Device lost = devs.back();
  auto net = small_mlp(8);
  nn::CrossEntropyLoss criterion;
  Batch b = batch(40, 6);
  criterion((*net)(b.x), b.y).backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& p : net->parameters()) want.push_back(p.grad().to_vector<double>());
  net->zero_grad();
  // The last device fails whatever it runs (as a device that is gone would) while `gone`.
  bool gone = true;
  auto on_a_lost_device = [&](const Tensor& out, const Tensor& y) -> Tensor {
    if (gone && default_device() == lost) throw Error("device lost");
    return criterion(out, y);
  };
  nn::DataParallel dp(net, devs);
  Tensor loss = dp.forward_backward(b.x, b.y, on_a_lost_device);
  ASSERT_EQ(dp.dropped().size(), 1u);
  EXPECT_EQ(dp.dropped()[0].first, lost);
  EXPECT_NE(dp.dropped()[0].second.find("device lost"), std::string::npos);
  EXPECT_EQ(dp.devices().size(), devs.size() - 1);
  EXPECT_EQ(total(dp.last_split()), 40);
  // Its share ran on another device: the step's gradients are the whole batch's.
  std::vector<Tensor> params = net->parameters();
  for (size_t j = 0; j < params.size(); j++) {
    std::vector<double> got = params[j].grad().to_vector<double>();
    for (size_t k = 0; k < got.size(); k++)
      ASSERT_NEAR(got[k], want[j][k], 1e-12 + 1e-10 * std::abs(want[j][k])) << j << " " << k;
  }
  // The next steps run on the devices left.
  dp.forward_backward(b.x, b.y, on_a_lost_device);
  EXPECT_EQ(total(dp.last_split()), 40);
  EXPECT_EQ(dp.dropped().size(), 1u);
  // Working again, it returns after rejoin_after() steps and runs a share.
  dp.rejoin_after(3);
  gone = false;
  for (int step = 1; step <= 3; step++) {
    dp.forward_backward(b.x, b.y, on_a_lost_device);
    EXPECT_EQ(dp.dropped().size(), step < 3 ? 1u : 0u) << "step " << step;
  }
  ASSERT_EQ(dp.devices(), devs);
  EXPECT_GT(dp.last_split().back(), 0);
  EXPECT_EQ(total(dp.last_split()), 40);
  // Failing again, it leaves for twice as long.
  gone = true;
  dp.forward_backward(b.x, b.y, on_a_lost_device);
  ASSERT_EQ(dp.dropped().size(), 1u);
  gone = false;
  for (int step = 1; step <= 7; step++) {
    dp.forward_backward(b.x, b.y, on_a_lost_device);
    EXPECT_EQ(dp.dropped().size(), step < 7 ? 1u : 0u) << "step " << step;
  }
  EXPECT_EQ(dp.devices(), devs);
  EXPECT_THROW(dp.rejoin_after(-1), Error);
}

// Float64 parameters of `net` and `other` made equal, from a seed.
void same_parameters(nn::Module& net, nn::Module& other, uint64_t seed) {
  Generator g(seed);
  std::vector<Tensor> a = net.parameters(), b = other.parameters();
  autograd::NoGradGuard no_grad;
  for (size_t j = 0; j < a.size(); j++) {
    Tensor v = sub(Tensor::rand(a[j].shape(), DType::Float64, g), 0.5);
    a[j].copy_(v);
    b[j].copy_(v);
  }
}

std::vector<std::vector<double>> gradients(nn::Module& net) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : net.parameters()) out.push_back(p.grad().to_vector<double>());
  return out;
}

void expect_near(const std::vector<std::vector<double>>& got,
                 const std::vector<std::vector<double>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); j++) {
    ASSERT_EQ(got[j].size(), want[j].size());
    for (size_t k = 0; k < got[j].size(); k++)
      ASSERT_NEAR(got[j][k], want[j][k], 1e-12 + 1e-10 * std::abs(want[j][k]))
          << what << ": parameter " << j << " element " << k;
  }
}

std::shared_ptr<nn::Sequential> mlp_with_dropout(Generator& masks) {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 32, true, DType::Float64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.4, masks),
      std::make_shared<nn::Linear>(32, 5, true, DType::Float64)});
}

TEST(DataParallel, DropoutMasksDoNotDependOnTheSplit) {
  // A sample's mask is drawn from the step's seed and its place in the batch: the gradients over
  // all the devices equal those over one device, step after step, and differ from step to step.
  Generator masks_one(21), masks_all(21);
  auto one = mlp_with_dropout(masks_one), all = mlp_with_dropout(masks_all);
  same_parameters(*one, *all, 4);
  nn::CrossEntropyLoss criterion;
  nn::DataParallel on_one(one, {cpu_devices()[0]}), on_all(all, cpu_devices());
  std::vector<std::vector<double>> before;
  for (int step = 0; step < 3; step++) {
    Batch b = batch(45, uint64_t(step));
    one->zero_grad();
    all->zero_grad();
    Tensor l1 = on_one.forward_backward(b.x, b.y, criterion);
    Tensor l2 = on_all.forward_backward(b.x, b.y, criterion);
    EXPECT_NEAR(l2.item(), l1.item(), 1e-12);
    expect_near(gradients(*all), gradients(*one), "step " + std::to_string(step));
    if (step == 0) before = gradients(*one);
  }
  // The masks really drop: a step without Dropout (eval) gives other gradients.
  Batch b = batch(45, 0);
  one->zero_grad();
  one->eval();
  nn::DataParallel(one, {cpu_devices()[0]}).forward_backward(b.x, b.y, criterion);
  std::vector<double> kept = gradients(*one)[0];
  double differ = 0;
  for (size_t k = 0; k < kept.size(); k++)
    differ = std::max(differ, std::abs(kept[k] - before[0][k]));
  EXPECT_GT(differ, 1e-3);

  // What is dropped: about p of the values, the others scaled by 1 / (1 - p); the same values on
  // one device as on all, in forward() too.
  Generator g1(5), g2(5);
  auto drop1 = std::make_shared<nn::Dropout>(0.3, g1),
       drop2 = std::make_shared<nn::Dropout>(0.3, g2);
  Tensor x = Tensor::ones({400, 25}, DType::Float64);
  std::vector<double> y1 =
      nn::DataParallel(drop1, {cpu_devices()[0]}).forward(x).to_vector<double>();
  std::vector<double> y2 = nn::DataParallel(drop2, cpu_devices()).forward(x).to_vector<double>();
  ASSERT_EQ(y1, y2);
  size_t zeros = 0;
  for (double v : y1) {
    ASSERT_TRUE(v == 0 || std::abs(v - 1 / 0.7) < 1e-15) << v;
    zeros += v == 0;
  }
  EXPECT_NEAR(double(zeros) / double(y1.size()), 0.3, 0.03);
}

TEST(DataParallel, BatchNormSharesNormaliseAloneAndUpdateTheRunningStatisticsOnce) {
  auto make = [] {
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::BatchNorm2d>(3, 1e-5, 0.1, true, DType::Float64),
        std::make_shared<nn::Flatten>(),
        std::make_shared<nn::Linear>(12, 5, true, DType::Float64)});
  };
  auto net = make(), whole = make(), parts = make();
  same_parameters(*net, *whole, 8);
  same_parameters(*net, *parts, 8);
  nn::CrossEntropyLoss criterion;
  Generator g(3);
  Tensor x = add(mul(Tensor::rand({37, 3, 2, 2}, DType::Float64, g), 3.0), 1.0);
  Batch b = batch(37, 9);
  nn::DataParallel dp(net, cpu_devices());
  Tensor loss = dp.forward_backward(x, b.y, criterion);
  // Running statistics: those of one call on the whole batch, updated once.
  (*whole)(x);
  auto& bn = static_cast<nn::BatchNorm2d&>(*net->named_children()[0].second);
  auto& bn_whole = static_cast<nn::BatchNorm2d&>(*whole->named_children()[0].second);
  for (auto [got, want] : {std::pair{bn.running_mean, bn_whole.running_mean},
                           std::pair{bn.running_var, bn_whole.running_var}}) {
    std::vector<double> g1 = got.to_vector<double>(), w1 = want.to_vector<double>();
    for (size_t c = 0; c < 3; c++) EXPECT_NEAR(g1[c], w1[c], 1e-12) << c;
  }
  EXPECT_EQ(bn.num_batches_tracked.item(), 1);
  // Gradients: each share normalised by its own statistics, its loss weighted by its size.
  const std::vector<int64_t> split = dp.last_split();
  int64_t at = 0;
  for (int64_t count : split) {
    if (count == 0) continue;
    Tensor part = criterion((*parts)(x.slice(0, at, at + count)), b.y.slice(0, at, at + count));
    mul(part, double(count) / 37.0).backward();
    at += count;
  }
  expect_near(gradients(*net), gradients(*parts), "split " + std::to_string(split[0]));
  // A failed step changes no statistics.
  auto failing = [&](const Tensor&, const Tensor&) -> Tensor { throw Error("no loss here"); };
  EXPECT_THROW(dp.forward_backward(x, b.y, failing), Error);
  EXPECT_EQ(bn.num_batches_tracked.item(), 1);
  // Float32, the layer's default: the same running statistics, to float32 rounding.
  auto net32 = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(12, 5)});
  nn::DataParallel dp32(net32, cpu_devices());
  dp32.forward_backward(x.to(DType::Float32), b.y, criterion);
  auto& bn32 = static_cast<nn::BatchNorm2d&>(*net32->named_children()[0].second);
  std::vector<double> got = bn32.running_var.to_double_vector(),
                      want = bn_whole.running_var.to_vector<double>();
  for (size_t c = 0; c < 3; c++) EXPECT_NEAR(got[c], want[c], 1e-5) << c;
}

}  // namespace
