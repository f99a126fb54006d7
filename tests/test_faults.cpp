// Faults contained: a kernel that fails, or throws, inside a task on a device queue (a logical CPU
// device, OpenCL) becomes an opforge::Error naming op, variant and device, raised to whoever
// reads the result; Halide's error text is the failing call's own; the process goes on. Errors the
// call's arguments cause are not held against the variant. The kernels here are injected: they
// behave like generated ones (argv entry points) but fail on purpose.
#include <HalideRuntime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace opforge;

std::atomic<int> faulty_calls{0};

// Reports through Halide's error handler with the call's user context, as a generated kernel does.
int reporting_kernel(void** args) {
  faulty_calls++;
  void* uc = *static_cast<void**>(args[0]);
  halide_error(uc, "injected fault\n");
  return halide_error_code_generic_error;
}
int throwing_kernel(void**) {
  faulty_calls++;
  throw std::runtime_error("injected exception");
}
// Refuses its arguments the way a generated kernel refuses a buffer of the wrong type.
int refusing_kernel(void** args) {
  faulty_calls++;
  halide_error(*static_cast<void**>(args[0]), "injected: buffer in0 has the wrong type\n");
  return halide_error_code_bad_type;
}

constexpr BufferSpec kBuffers[] = {{"in0", BufferRole::input, DType::Float32, 6},
                                   {"out", BufferRole::output, DType::Float32, 6}};
constexpr KernelVariant fault_variant(const char* op, const char* variant, const char* target,
                                      int (*fn)(void**)) {
  return {op,      "elementwise", "float32", DType::Float32, DType::Float32,    kBuffers, 2, "", 0,
          variant, target,        fn,        nullptr,        {0, 0, 0, 0, 0, 0}};
}
const KernelVariant kFaulty[] = {
    fault_variant("test_fault_report", "manual", "sse41", &reporting_kernel),
    fault_variant("test_fault_report", "gpu", "opencl", &reporting_kernel),
    fault_variant("test_fault_throw", "manual", "sse41", &throwing_kernel),
    fault_variant("test_fault_throw", "gpu", "opencl", &throwing_kernel),
    fault_variant("test_fault_args", "manual", "sse41", &refusing_kernel),
    fault_variant("test_fault_args", "other", "sse41", &refusing_kernel),
};

void register_once() {
  static bool done = (register_kernels(kFaulty, std::size(kFaulty)), true);
  (void)done;
}

bool logical_devices() {
  const char* v = std::getenv("OPFORGE_CPU_DEVICES");
  return v && *v;
}

// Calls run on the caller's thread: neither logical CPU devices nor PoCL in automatic placement.
bool inline_path() {
  const char* cl = std::getenv("OPFORGE_AUTO_CPU_OPENCL");
  return !logical_devices() && !(cl && std::string(cl) == "1");
}

// The devices a queued fault can be injected on here: a logical CPU device, OpenCL.
std::vector<Device> queued_devices() {
  std::vector<Device> d;
  if (logical_devices()) d.push_back(parse_device("cpu:1"));
  if (device_exists({DeviceKind::opencl, 0})) d.push_back({DeviceKind::opencl, 0});
  return d;
}

void expect_contains(const std::string& m, const std::string& part) {
  EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
}

TEST(Faults, QueuedKernelFailuresReachTheReaderAndTheProcessGoesOn) {
  register_once();
  if (queued_devices().empty()) GTEST_SKIP() << "no device with a queue here";
  for (const Device& d : queued_devices()) {
    SCOPED_TRACE(d.str());
    Tensor x = Tensor::ones({64});
    for (const char* op : {"test_fault_report", "test_fault_throw"}) {
      Tensor y;
      {
        DefaultDevice on(d);
        y = elementwise(op, {x});  // queued: returns at once
      }
      std::string m = ref::error_message([&] { y.to_vector<float>(); });
      expect_contains(m, std::string(op) + " (float32, variant ");
      expect_contains(m, d.str());
      expect_contains(
          m, std::string(op) == "test_fault_report" ? "injected fault" : "injected exception");
      // The error also stays with this thread's synchronize(), once.
      EXPECT_THROW(synchronize(), Error);
      EXPECT_NO_THROW(synchronize());
      // The device still runs work.
      DefaultDevice on(d);
      EXPECT_EQ(opforge::add(x, 1.0).to_vector<float>(), std::vector<float>(64, 2.0f));
    }
  }
}

TEST(Faults, AnotherThreadsSynchronizeDoesNotRaiseThisThreadsFailure) {
  register_once();
  if (queued_devices().empty()) GTEST_SKIP() << "no device with a queue here";
  Device d = queued_devices().front();
  Tensor y;
  {
    DefaultDevice on(d);
    y = elementwise("test_fault_report", {Tensor::ones({8})});
  }
  std::string other;
  std::thread t([&] { other = ref::error_message([] { synchronize(); }); });
  t.join();
  EXPECT_EQ(other, "(no error)");
  EXPECT_THROW(synchronize(), Error);
}

TEST(Faults, HalideErrorTextIsTheCallsOwn) {
  register_once();
  // Two threads fail at once on the caller's thread (the plain cpu): each sees its own text.
  std::string a, b;
  std::thread t1([&] {
    a = ref::error_message([] { elementwise("test_fault_report", {Tensor::ones({4})}); });
  });
  std::thread t2(
      [&] { b = ref::error_message([] { elementwise("test_fault_args", {Tensor::ones({4})}); }); });
  t1.join();
  t2.join();
  if (inline_path()) {
    expect_contains(a, "injected fault");
    EXPECT_EQ(a.find("wrong type"), std::string::npos) << a;
    expect_contains(b, "wrong type");
    EXPECT_EQ(b.find("injected fault"), std::string::npos) << b;
  }
  try {
    synchronize();
  } catch (const Error&) {
  }
}

TEST(Faults, ArgumentErrorsAreNotHeldAgainstTheVariant) {
  register_once();
  if (!inline_path()) GTEST_SKIP() << "checks the inline path";
  faulty_calls = 0;
  std::string m = ref::error_message([] { elementwise("test_fault_args", {Tensor::ones({4})}); });
  expect_contains(m, "the kernel refused the call's arguments");
  // Raised at once: the other variant was not tried, as it would refuse the same arguments.
  EXPECT_EQ(faulty_calls.load(), 1);
}

}  // namespace
