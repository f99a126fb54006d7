// The caching allocator of devices with memory of their own, over their backends' primitives.
#include "devices/gpu_memory.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/storage.hpp"
#include "kernels/kernel_call.hpp"
#include "opforge/error.hpp"

namespace opforge::detail {

std::string human_bytes(double b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    u++;
  }
  char s[48];
  std::snprintf(s, sizeof s, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return s;
}

void byte_buffer(halide_buffer_t& b, halide_dimension_t& dim, size_t bytes) {
  OPFORGE_CHECK(bytes <= size_t(INT32_MAX))
      << "a tensor on a GPU device holds at most 2 GiB (the 32-bit extents of generated kernels); "
      << "this one needs " << bytes << " bytes";
  dim = {0, int32_t(bytes), 1, 0};
  b.type = {halide_type_uint, 8, 1};
  b.dimensions = 1;
  b.dim = &dim;
}

DeviceMemory::DeviceMemory(GpuBackend& backend)
    : backend_(backend), total_(backend.info().total_memory), limit_(total_) {}

DeviceBlock* DeviceMemory::allocate(size_t bytes, const Storage* for_storage) {
  size_t cap = size_class(std::max<size_t>(bytes, 1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cap);
    if (it != free_.end() && !it->second.empty()) {
      DeviceBlock* b = it->second.back();
      it->second.pop_back();
      cached_ -= cap;
      allocated_ += cap;
      return b;
    }
  }
  auto b = std::make_unique<DeviceBlock>();
  byte_buffer(b->buf, b->dim, cap);
  b->capacity = cap;
  auto try_malloc = [&] {
    if (allocated_ + cap > limit_) return false;
    take_halide_error();
    return backend_.allocate(*b);
  };
  if (!try_malloc()) {
    empty_cache();
    // Then the copies that host tensors keep here as a cache, and stale copies.
    if (!try_malloc() && !evict_until(for_storage, cap, [&] {
          empty_cache();
          return try_malloc();
        })) {
      std::string why = allocated_ + cap > limit_ ? "" : " (" + take_halide_error() + ")";
      throw OutOfMemoryError(
          device().str() + ": out of memory allocating " + human_bytes(double(bytes)) + " (" +
          std::to_string(bytes) + " bytes)" + why + "; " + human_bytes(double(allocated_)) +
          " held by tensors, cache emptied; this process may use " + human_bytes(double(limit_)) +
          " of " + human_bytes(double(total_)) + " (set_memory_fraction)");
    }
  }
  allocated_ += cap;
  return b.release();
}

void DeviceMemory::remember(Storage* s) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  holders_[s] = ++use_clock_;
}

void DeviceMemory::forget(Storage* s) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  holders_.erase(s);
}

bool DeviceMemory::evict_until(const Storage* skip, size_t bytes,
                               const std::function<bool()>& fits) {
  std::lock_guard<std::mutex> lock(holders_mu_);
  std::vector<std::pair<uint64_t, Storage*>> by_age;
  for (auto [s, used] : holders_)
    if (s != skip) by_age.emplace_back(used, s);
  std::sort(by_age.begin(), by_age.end());
  size_t freed = 0;
  for (auto [used, s] : by_age) {
    size_t n = s->evict(*this);
    if (n == 0) continue;
    holders_.erase(s);
    freed += n;
    // Blocks come in size classes: retry once what went back could hold the request.
    if (freed >= bytes) {
      if (fits()) return true;
      freed = 0;
    }
  }
  return freed > 0 && fits();
}

void DeviceMemory::release(DeviceBlock* b) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[b->capacity].push_back(b);
  cached_ += b->capacity;
  allocated_ -= b->capacity;
}

void DeviceMemory::empty_cache() {
  std::unordered_map<size_t, std::vector<DeviceBlock*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    cached_ = 0;
  }
  for (auto& [cap, list] : blocks)
    for (DeviceBlock* b : list) {
      backend_.free(*b);
      delete b;
    }
}

size_t DeviceMemory::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_ + cached_;
}

void DeviceMemory::set_fraction(double fraction) {  // in (0, 1]: set_memory_fraction checked it
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = size_t(fraction * double(total_));
}

void DeviceMemory::count(bool to_device, size_t bytes, double seconds) {
  copied_[to_device] += bytes;
  // Small copies measure latency, not bandwidth.
  if (bytes >= (size_t(1) << 16) && seconds > 0) {
    double bw = bandwidth_.load(std::memory_order_relaxed);
    bandwidth_.store(0.8 * bw + 0.2 * double(bytes) / seconds, std::memory_order_relaxed);
  }
}

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void DeviceMemory::upload(DeviceBlock& b, const void* src, size_t bytes) {
  if (!bytes) return;
  auto t0 = std::chrono::steady_clock::now();
  backend_.upload(b, src, bytes);
  count(true, bytes, since(t0));
}

void DeviceMemory::download(const DeviceBlock& b, void* dst, size_t bytes) {
  if (!bytes) return;
  auto t0 = std::chrono::steady_clock::now();
  backend_.download(b, dst, bytes);
  count(false, bytes, since(t0));
}

void DeviceMemory::copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst,
                        size_t dst_offset, size_t n) {
  if (n) backend_.copy(src, src_offset, dst, dst_offset, n);
}

DeviceMemory* device_memory(const Device& d) {
  Backend* b = backend(d);
  return b && b->runs_kernels() ? b->memory() : nullptr;
}

}  // namespace opforge::detail
