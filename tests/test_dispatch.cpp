// Variant selection with an injected clock: fake kernels advance a fake time by a programmable
// cost, so the tests control exactly what the performance model measures.
#include <gtest/gtest.h>

#include <map>

#include "opforge/opforge.hpp"

namespace {
using namespace opforge;

double fake_now = 0;
std::map<std::string, double> fake_cost;  // seconds per call, by variant
std::map<std::string, int> fake_calls;

template <int I>
int fake_kernel(void**) {
  static const char* names[] = {"fast_small", "fast_large", "manual"};
  fake_now += fake_cost[names[I]];
  fake_calls[names[I]]++;
  return 0;
}
int failing_kernel(void**) { return -1; }

// A float32 elementwise test kernel (one 6-D input, one output); min0: its minimum innermost
// extent.
constexpr BufferSpec kFakeBuffers[] = {{"in0", BufferRole::input, DType::Float32, 6},
                                       {"out", BufferRole::output, DType::Float32, 6}};
constexpr KernelVariant fake_variant(const char* op, const char* variant, int (*fn)(void**),
                                     int64_t min0 = 0) {
  return {op,
          "elementwise",
          "float32",
          DType::Float32,
          DType::Float32,
          kFakeBuffers,
          2,
          "",
          0,
          variant,
          "sse41",
          fn,
          nullptr,
          {min0, 0, 0, 0, 0, 0}};
}

const KernelVariant kFake[] = {
    fake_variant("test_fake", "fast_small", &fake_kernel<0>),
    fake_variant("test_fake", "fast_large", &fake_kernel<1>, 1000),
    fake_variant("test_fake", "manual", &fake_kernel<2>),
    fake_variant("test_failing", "manual", &failing_kernel),
};

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static bool registered = (register_kernels(kFake, std::size(kFake)), true);
    (void)registered;
    set_clock([] { return fake_now; });
    DispatchPolicy p;
    p.calibration_runs = 3;
    p.retime_every = 10;
    p.explore_every = 1000000;
    set_dispatch_policy(p);
    reset_performance_model();
    force_variant("");
    fake_calls.clear();
    fake_cost = {{"fast_small", 1e-3}, {"fast_large", 5e-4}, {"manual", 2e-3}};
  }
  void TearDown() override {
    set_clock({});
    set_dispatch_policy(DispatchPolicy{});
    force_variant("");
  }
  const KernelGroup& group() { return op_info("test_fake").group("float32"); }
  void call(int64_t n) {
    CallExtents e;
    e.n = 6;
    e.e[0] = n;
    for (int i = 1; i < 6; i++) e.e[i] = 1;
    dispatch(group(), e, nullptr);
  }
};

TEST_F(DispatchTest, CalibratesEveryEligibleVariantThenUsesTheFastest) {
  for (int i = 0; i < 9; i++) call(4096);
  EXPECT_EQ(fake_calls["fast_small"], 3);
  EXPECT_EQ(fake_calls["fast_large"], 3);
  EXPECT_EQ(fake_calls["manual"], 3);
  fake_calls.clear();
  for (int i = 0; i < 50; i++) call(4096);
  EXPECT_EQ(fake_calls["fast_large"], 50);
}

TEST_F(DispatchTest, NeverCallsAVariantBelowItsMinimum) {
  for (int i = 0; i < 40; i++) call(100);
  EXPECT_EQ(fake_calls["fast_large"], 0);
  EXPECT_EQ(fake_calls["fast_small"], 37);  // 3 calibration runs of manual, the rest the faster
}

TEST_F(DispatchTest, BucketsAreIndependent) {
  fake_cost["fast_large"] = 1.0;  // slow in this bucket, never eligible in the small one
  for (int i = 0; i < 30; i++) call(4096);
  for (int i = 0; i < 30; i++) call(64);
  fake_calls.clear();
  call(4096);
  call(64);
  EXPECT_EQ(fake_calls["fast_small"], 2);
}

TEST_F(DispatchTest, NoticesAVariantThatBecameSlow) {
  for (int i = 0; i < 9; i++) call(4096);
  fake_cost["fast_large"] = 1e-2;  // the machine changed: now 20x slower than fast_small
  for (int i = 0; i < 200; i++) call(4096);
  fake_calls.clear();
  for (int i = 0; i < 20; i++) call(4096);
  EXPECT_EQ(fake_calls["fast_large"], 0);
  EXPECT_EQ(fake_calls["fast_small"] + fake_calls["manual"], 20);
}

TEST_F(DispatchTest, OneOutlierDoesNotMoveTheChoice) {
  for (int i = 0; i < 9; i++) call(4096);
  for (int i = 0; i < 9; i++) call(4096);  // reaches a re-timing
  fake_cost["fast_large"] = 1.0;           // one preempted call ...
  call(4096);
  call(4096);
  fake_cost["fast_large"] = 5e-4;  // ... then back to normal
  fake_calls.clear();
  for (int i = 0; i < 30; i++) call(4096);
  EXPECT_EQ(fake_calls["fast_large"], 30);
}

TEST_F(DispatchTest, ForcedVariantIsTheOnlyOneCalled) {
  force_variant("manual");
  for (int i = 0; i < 20; i++) call(4096);
  EXPECT_EQ(fake_calls["manual"], 20);
  EXPECT_EQ(forced_variant(), "manual");
}

TEST_F(DispatchTest, ForcedPrefixMatchesSizedVariants) {
  force_variant("fast");
  for (int i = 0; i < 20; i++) call(4096);
  EXPECT_EQ(fake_calls["manual"], 0);
  EXPECT_EQ(fake_calls["fast_small"] + fake_calls["fast_large"], 20);
}

TEST_F(DispatchTest, ForcedVariantBelowItsMinimumIsAnError) {
  force_variant("fast_large");
  try {
    call(10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast_large"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what();
  }
}

TEST_F(DispatchTest, FailingKernelBecomesAnError) {
  const KernelGroup& g = op_info("test_failing").group("float32");
  CallExtents e;
  e.n = 1;
  e.e[0] = 4;
  EXPECT_THROW(dispatch(g, e, nullptr), Error);
}

int good_calls = 0, bad_calls = 0;
int good_kernel(void**) {
  fake_now += 1e-3;
  good_calls++;
  return 0;
}
int bad_kernel(void**) {
  bad_calls++;
  return -1;
}
const KernelVariant kFlaky[] = {fake_variant("test_flaky", "good", &good_kernel),
                                fake_variant("test_flaky", "bad", &bad_kernel),
                                fake_variant("test_flaky", "good_too", &good_kernel)};

// A variant whose kernel fails (a driver that cannot build it, say) leaves the bucket at once; the
// call runs again on another variant, so the caller sees no error, and the bucket's calibration of
// the variants left completes.
TEST_F(DispatchTest, AFailingVariantIsDroppedAndTheCallRunsOnAnother) {
  static bool registered = (register_kernels(kFlaky, std::size(kFlaky)), true);
  (void)registered;
  const KernelGroup& g = op_info("test_flaky").group("float32");
  CallExtents e;
  e.n = 1;
  e.e[0] = 4;
  good_calls = bad_calls = 0;
  for (int i = 0; i < 30; i++) EXPECT_NO_THROW(dispatch(g, e, nullptr));
  EXPECT_EQ(bad_calls, 1);
  EXPECT_EQ(good_calls, 30);
  int64_t bad_chosen = 0;
  for (const auto& st : dispatch_stats())
    if (st.op == "test_flaky" && st.variant == "bad") bad_chosen = st.calls;
  EXPECT_EQ(bad_chosen, 1);
}

// Where every variant fails, each call reports the kernel's error: no endless retries.
TEST_F(DispatchTest, WhenEveryVariantFailsEachCallIsAnError) {
  const KernelGroup& g = op_info("test_failing").group("float32");
  CallExtents e;
  e.n = 1;
  e.e[0] = 4;
  for (int i = 0; i < 5; i++) {
    try {
      dispatch(g, e, nullptr);
      ADD_FAILURE() << "no error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("kernel failed"), std::string::npos) << err.what();
    }
  }
}

TEST_F(DispatchTest, StatsCountCallsPerVariant) {
  for (int i = 0; i < 30; i++) call(4096);
  int64_t total = 0;
  for (const auto& s : dispatch_stats())
    if (s.op == "test_fake") total += s.calls;
  EXPECT_EQ(total, 30);
}

TEST(DispatchReal, RealKernelErrorIsCaughtNotAborted) {
  // A generated kernel whose buffer checks fail must raise, not abort the process.
  const KernelGroup& g = op_info("add").group("float32");
  Tensor a = Tensor::ones({4});
  CallExtents e;
  e.n = 6;
  for (int i = 0; i < 6; i++) e.e[i] = 1;
  e.e[0] = 4;
  void* context = nullptr;
  void* args[4] = {&context, nullptr, nullptr, nullptr};
  EXPECT_THROW(dispatch(g, e, args), Error);
}

}  // namespace
