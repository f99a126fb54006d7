// The per-call path on a known shape bucket: it allocates nothing on the heap but the result's
// storage (counted with a replaced operator new), and two threads calling ops at once both make
// progress and get correct results (no call waits on a lock another call holds for long).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
thread_local int64_t heap_allocations = 0;
}  // namespace

// Every heap allocation of this test binary (the library included) is counted per thread. The
// replacements pair malloc with free themselves; GCC 12 cannot see that through inlining.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  ++heap_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  ++heap_allocations;
  size_t align = size_t(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return ::operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {
using namespace ref;

// Calls run on the caller's thread (the inline path) unless logical CPU devices or PoCL in
// automatic placement send them to device queues, whose tasks are allocated.
bool inline_path() {
  const char* cpu = std::getenv("OPFORGE_CPU_DEVICES");
  const char* cl = std::getenv("OPFORGE_AUTO_CPU_OPENCL");
  return !(cpu && *cpu) && !(cl && std::string(cl) == "1");
}

// Heap allocations per call of f, after enough calls to calibrate its bucket.
double allocations_per_call(const std::function<void()>& f) {
  for (int i = 0; i < 2000; i++) f();
  int64_t before = heap_allocations;
  constexpr int kCalls = 1000;
  for (int i = 0; i < kCalls; i++) f();
  return double(heap_allocations - before) / kCalls;
}

TEST(CallPath, AKnownBucketAllocatesNothingButTheResultsStorage) {
  if (!inline_path()) GTEST_SKIP() << "calls are queued in this configuration";
  Tensor a = random({4}, DType::Float32, Data::Normal, "callpath/a");
  Tensor b = random({4}, DType::Float32, Data::Normal, "callpath/b");
  Tensor m = random({3, 4}, DType::Float32, Data::Normal, "callpath/m");
  // One allocation: the result's Storage (its memory comes from the caching allocator).
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::add(a, b); }), 1.0);
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::mul(m, b); }), 1.0);  // broadcast
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::relu(m); }), 1.0);
  // Scalar attributes are kernel parameters, not tensors.
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::leaky_relu(a, 0.2); }), 1.0);
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::clip(m, -0.5, 0.5); }), 1.0);
  // A number next to a tensor reuses the thread's wrapped-number tensor.
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::add(a, 2.0); }), 1.0);
  EXPECT_LE(allocations_per_call([&] { Tensor c = opforge::mul(m, -0.5); }), 1.0);
  // Writing into existing tensors allocates nothing.
  Tensor out = Tensor::empty({4});
  EXPECT_LE(allocations_per_call([&] { opforge::add_out(out, a, b); }), 0.0);
  EXPECT_LE(allocations_per_call([&] { out.mul_(b); }), 0.0);
  EXPECT_LE(allocations_per_call([&] { opforge::axpy_(out, 0.5, a); }), 0.0);
  // The results are still right.
  Tensor y = random({4}, DType::Float32, Data::Normal, "callpath/y");
  Expected want =
      broadcast_eval({y, a}, [](const std::vector<double>& v) { return v[0] + 0.5 * v[1]; });
  opforge::axpy_(y, 0.5, a);
  expect_close(y, want, DType::Float32, tol_for(DType::Float32));
  // Each number is its own, also while an earlier result that read another is still alive.
  Tensor plus2 = opforge::add(a, 2.0), minus3 = opforge::add(a, -3.0);
  expect_close(plus2, broadcast_eval({a}, [](const std::vector<double>& v) { return v[0] + 2; }),
               DType::Float32, tol_for(DType::Float32));
  expect_close(minus3, broadcast_eval({a}, [](const std::vector<double>& v) { return v[0] - 3; }),
               DType::Float32, tol_for(DType::Float32));
}

TEST(CallPath, TwoThreadsCallingTinyOpsBothGetTheirResults) {
  std::atomic<int> wrong{0};
  auto work = [&](uint64_t seed) {
    Tensor a = random({4}, DType::Float32, Data::Normal, "callpath/t" + std::to_string(seed));
    Tensor b = random({4}, DType::Float32, Data::Normal, "callpath/u" + std::to_string(seed));
    std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
    for (int i = 0; i < 20000; i++) {
      Tensor c = opforge::add(a, b);
      if (i % 1000 == 0) {
        std::vector<double> cv = c.to_double_vector();
        for (size_t k = 0; k < 4; k++)
          if (float(cv[k]) != float(av[k]) + float(bv[k])) wrong++;
      }
    }
  };
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Each thread counts its kernel runs in a table of its own (a shared counter would bounce between
// the cores on every call): the device's total is still every run, from every thread.
TEST(CallPath, KernelRunsFromSeveralThreadsAllCount) {
  opforge::Tensor a = random({4}, opforge::DType::Float32, Data::Normal, "callpath/runs_a");
  opforge::Tensor b = random({4}, opforge::DType::Float32, Data::Normal, "callpath/runs_b");
  // Every device's runs: in the test configurations with several devices the calls are spread
  // over them, and queued ones count when their device has run them (synchronize()).
  auto runs = [] {
    opforge::synchronize();
    int64_t n = 0;
    for (const opforge::DeviceStats& s : opforge::device_stats()) n += s.kernel_calls;
    return n;
  };
  const int64_t before = runs();
  constexpr int kCalls = 3000;
  auto work = [&] {
    for (int i = 0; i < kCalls; i++) opforge::Tensor c = opforge::add(a, b);
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  work();
  EXPECT_EQ(runs() - before, 3 * kCalls);
}

}  // namespace
